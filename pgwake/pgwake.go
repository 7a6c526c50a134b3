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
//
// Listen holds a connection for one table. A relay of many tables
// (relay.Group) holds one for all of them with a Listener (relay's
// ExampleGroup shows it whole):
//
//	l, err := pgwake.NewListener(ctx, &pgwake.ListenerConfig{DatabaseURL: url})
//	wake, stop, err := l.Subscribe(ctx, "tenant_a.outbox")
//	err = group.Add(relay.Table{Name: "tenant_a.outbox", Store: store, Wakeup: wake})
package pgwake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	if _, err := outbox.NotifyChannel(table); err != nil {
		return nil, fmt.Errorf("pgwake: %w", err)
	}
	l, err := NewListener(ctx, &ListenerConfig{DatabaseURL: cfg.DatabaseURL, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	wake, _, err := l.Subscribe(ctx, table)
	return wake, err
}

// parseURL parses a connection string once: pgx's parse errors quote the
// string, and not every form of password in it is redacted there (a URL's
// ?password=).
func parseURL(url string) (*pgx.ConnConfig, error) {
	if url == "" {
		return nil, errors.New("pgwake: Config.DatabaseURL is required")
	}
	pgcfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errors.New("pgwake: Config.DatabaseURL is not a valid PostgreSQL URL or keyword/value string (not repeated here: it may hold a password)")
	}
	return pgcfg, nil
}
