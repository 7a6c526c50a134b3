// Package pgwake wakes relays the moment new outbox rows commit, through
// PostgreSQL LISTEN/NOTIFY, instead of at their next poll.
//
// It needs the trigger of outbox.NotifySchema on the table (or
// `outbox schema --notify`), which notifies on commit. Weigh its cost first:
// PostgreSQL serialises the commits of notifying transactions, which matters
// for tables written by many concurrent transactions; polling with a short
// relay.Config.PollInterval is the alternative.
//
//	wake, err := pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: url, Table: "outbox"})
//	r, err := relay.New(store, pub, &relay.Config{Wakeup: wake})
package pgwake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acemq/outbox"
)

// Config configures Listen.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required. Listen
	// holds one connection of its own.
	DatabaseURL string

	// Logger receives reconnection warnings. Defaults to slog.Default().
	Logger *slog.Logger

	// Table is the outbox table, as given to outbox.StoreConfig. Defaults
	// to "outbox".
	Table string
}

// Listen connects, listens on the table's notification channel and returns
// a channel that receives a value whenever a transaction that wrote to the
// table commits (values are coalesced: one pending wake-up at most). It
// keeps listening, reconnecting with a jittered backoff after a lost
// connection (and sending a wake-up then, for what it may have missed),
// until ctx ends. The returned channel is never closed.
//
// The first connection is made before Listen returns, so that a wrong URL
// or an unreachable server is reported at once.
func Listen(ctx context.Context, cfg *Config) (<-chan struct{}, error) {
	if cfg == nil || cfg.DatabaseURL == "" {
		return nil, errors.New("pgwake: Config.DatabaseURL is required")
	}
	table := cfg.Table
	if table == "" {
		table = outbox.TableDefault
	}
	channel, err := outbox.NotifyChannel(table)
	if err != nil {
		return nil, fmt.Errorf("pgwake: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	// Parsed once, here: pgx's parse errors quote the string, and not
	// every form of password in it is redacted there (a URL's ?password=).
	pgcfg, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("pgwake: Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value string (not repeated here: it may hold a password)")
	}
	l := &listener{config: pgcfg, channel: channel, logger: logger, wake: make(chan struct{}, 1)}
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	go l.run(ctx, conn)
	return l.wake, nil
}

// reconnectBackoff is the wait before the n-th reconnection attempt.
var reconnectBackoff = outbox.ExponentialBackoff(100*time.Millisecond, 30*time.Second)

type listener struct {
	config  *pgx.ConnConfig
	channel string
	logger  *slog.Logger
	wake    chan struct{}
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.config.Copy())
	if err != nil {
		return nil, fmt.Errorf("pgwake: connecting: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pgwake: LISTEN %s: %w", l.channel, err)
	}
	return conn, nil
}

func (l *listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default: // one pending wake-up is enough
	}
}

func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	failures := 0
	for {
		if conn == nil {
			var err error
			if conn, err = l.connect(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				wait := reconnectBackoff(failures)
				l.logger.WarnContext(ctx, "pgwake: Cannot listen; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				continue
			}
			failures = 0
			l.signal() // notifications may have been missed while disconnected
		}
		_, err := conn.WaitForNotification(ctx)
		if err == nil {
			l.signal()
			continue
		}
		conn.Close(context.WithoutCancel(ctx))
		conn = nil
		if ctx.Err() != nil {
			return
		}
		l.logger.WarnContext(ctx, "pgwake: Lost the listening connection; reconnecting", slog.String("error", err.Error()))
	}
}
