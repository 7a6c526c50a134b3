package pgwake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/periodic"
)

// ListenerConfig configures NewListener.
type ListenerConfig struct {
	// DatabaseURL is the PostgreSQL connection string. Required. The
	// Listener holds one connection of its own (a direct one: LISTEN does
	// not work through a transaction pooler).
	DatabaseURL string

	// Logger receives reconnection warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// Listener listens on the notification channels of many tables on one
// connection, and wakes each table's subscribers when a transaction that
// wrote to it commits: a relay of a thousand tables holds one connection
// for its wake-ups, not a thousand. Tables are subscribed to and let go
// while it runs. After a lost connection it reconnects with a jittered
// backoff, listens on every channel again and wakes every subscriber (for
// what it may have missed). Its methods may be called from any goroutine.
type Listener struct {
	config *pgx.ConnConfig
	logger *slog.Logger
	done   chan struct{} // closed when the listener has stopped (its ctx ended)

	mu        sync.Mutex
	subs      map[string]map[chan struct{}]struct{} // by channel
	waiting   map[string][]chan error               // Subscribe calls waiting for their channel's LISTEN, by channel
	down      bool                                  // the connection is lost: Subscribe does not wait
	changed   chan struct{}                         // one value: subscriptions changed since the connection's were made
	interrupt context.CancelFunc                    // ends the current wait for a notification; nil when not waiting
}

// NewListener connects and returns a Listener that runs until ctx ends.
// The connection is made before NewListener returns, so that a wrong URL
// or an unreachable server is reported at once.
func NewListener(ctx context.Context, cfg *ListenerConfig) (*Listener, error) {
	if cfg == nil {
		cfg = &ListenerConfig{}
	}
	pgcfg, err := parseURL(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	l := &Listener{config: pgcfg, logger: logger, done: make(chan struct{}), subs: map[string]map[chan struct{}]struct{}{},
		waiting: map[string][]chan error{}, changed: make(chan struct{}, 1)}
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	go l.run(ctx, conn)
	return l, nil
}

// Subscribe returns a channel that receives a value whenever a transaction
// that wrote to table commits (coalesced: one pending wake-up at most; it
// is never closed), and a function that ends the subscription (the
// channel's LISTEN ends with its last subscriber). It returns once the
// table's channel is listened on, or, while the connection is down, at
// once: the channel is listened on when it is back, and the subscribers
// woken then. An error says that table is not a valid table name, that
// the server refused the LISTEN (a hot standby does), or that ctx ended
// first.
func (l *Listener) Subscribe(ctx context.Context, table string) (<-chan struct{}, func(), error) {
	channel, err := outbox.NotifyChannel(table)
	if err != nil {
		return nil, nil, fmt.Errorf("pgwake: %w", err)
	}
	wake := make(chan struct{}, 1)
	listened := make(chan error, 1)
	l.mu.Lock()
	if l.subs[channel] == nil {
		l.subs[channel] = map[chan struct{}]struct{}{}
	}
	l.subs[channel][wake] = struct{}{}
	if l.down {
		listened <- nil // listened on when the connection is back
	} else {
		l.waiting[channel] = append(l.waiting[channel], listened)
	}
	l.poke()
	l.mu.Unlock()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.subs[channel], wake)
			if len(l.subs[channel]) == 0 {
				delete(l.subs, channel)
				l.poke()
			}
		})
	}
	select {
	case err := <-listened:
		if err != nil {
			stop()
			return nil, nil, err
		}
		return wake, stop, nil
	case <-l.done:
		return wake, stop, nil // stopped: nothing more will wake it, and nothing is wrong
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
}

// poke tells the listening goroutine that the subscriptions changed, and
// ends its wait for a notification (l.mu held).
func (l *Listener) poke() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
	if l.interrupt != nil {
		l.interrupt()
	}
}

// reconnectBackoff is the wait before the n-th reconnection attempt.
var reconnectBackoff = outbox.ExponentialBackoff(100*time.Millisecond, 30*time.Second)

func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.config.Copy())
	if err != nil {
		return nil, fmt.Errorf("pgwake: connecting: %w", err)
	}
	return conn, nil
}

// run is the listening goroutine: it alone uses the connection.
func (l *Listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	listening := map[string]bool{} // the channels listened on conn
	failures, fresh := 0, false    // fresh: conn is a new connection, its subscribers not yet woken
	// backOff logs err and waits before the next connection; false: ctx
	// ended.
	backOff := func(msg string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		wait := reconnectBackoff(failures)
		l.logger.WarnContext(ctx, msg, slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		return periodic.Sleep(ctx, wait)
	}
	for {
		if conn == nil {
			var err error
			if conn, err = l.connect(ctx); err != nil {
				if !backOff("pgwake: Cannot listen; retrying", err) {
					return
				}
				continue
			}
			listening = map[string]bool{}
			fresh = true
		}
		err := l.listenAsSubscribed(ctx, conn, listening)
		if err == nil && fresh {
			fresh, failures = false, 0
			l.mu.Lock()
			l.down = false
			l.mu.Unlock()
			l.wakeAll() // listening again: what was missed while disconnected is found by the claims this starts
		}
		if err == nil {
			err = l.waitOnce(ctx, conn)
		}
		if err == nil {
			continue
		}
		conn.Close(context.WithoutCancel(ctx))
		conn = nil
		l.release(err) // their LISTEN comes with the next connection
		if !backOff("pgwake: Lost the listening connection; reconnecting", err) {
			return
		}
	}
}

// listenAsSubscribed makes conn listen on the channels subscribed to and
// on no others, then lets the Subscribe calls waiting for them return.
func (l *Listener) listenAsSubscribed(ctx context.Context, conn *pgx.Conn, listening map[string]bool) error {
	l.mu.Lock()
	select {
	case <-l.changed:
	default:
	}
	want := make(map[string]bool, len(l.subs))
	for ch := range l.subs {
		want[ch] = true
	}
	l.mu.Unlock()
	for ch := range want {
		if !listening[ch] {
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && !conn.IsClosed() {
					return refusedError{ch, fmt.Errorf("LISTEN %s: %w", ch, err)}
				}
				return fmt.Errorf("LISTEN: %w", err)
			}
			listening[ch] = true
		}
	}
	for ch := range listening {
		if !want[ch] {
			if _, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return fmt.Errorf("UNLISTEN: %w", err)
			}
			delete(listening, ch)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch, ws := range l.waiting {
		if listening[ch] || l.subs[ch] == nil { // listened on, or given up (Subscribe's ctx ended)
			for _, w := range ws {
				w <- nil
			}
			delete(l.waiting, ch)
		}
	}
	return nil
}

// waitOnce waits for one notification and wakes its channel's
// subscribers; a change of the subscriptions ends the wait early. It
// returns an error only when the connection is lost or ctx ended.
func (l *Listener) waitOnce(ctx context.Context, conn *pgx.Conn) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.mu.Lock()
	l.interrupt = cancel
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
	}()
	select {
	case <-l.changed: // changed before the wait began: make the connection's subscriptions again first
		return nil
	default:
	}
	n, err := conn.WaitForNotification(wctx)
	switch {
	case err == nil:
		l.wake(n.Channel)
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wctx.Err() != nil && !conn.IsClosed():
		return nil // interrupted: the connection is still good (pgx ends a wait by a read deadline)
	}
	return err
}

func (l *Listener) wake(channel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs[channel] {
		signal(ch)
	}
}

func (l *Listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, subs := range l.subs {
		for ch := range subs {
			signal(ch)
		}
	}
}

// release lets every waiting Subscribe call return, the connection being
// lost on err: with err those of a channel whose LISTEN the server refused
// (the subscription cannot work), with nil the others (it will be listened on when the
// connection is back). Until then, Subscribe does not wait.
func (l *Listener) release(err error) {
	var refused refusedError
	errors.As(err, &refused)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = true
	for ch, ws := range l.waiting {
		var werr error
		if ch == refused.channel {
			werr = fmt.Errorf("pgwake: %w", refused.err)
		}
		for _, w := range ws {
			w <- werr
		}
		delete(l.waiting, ch)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // one pending wake-up is enough
	}
}

// refusedError is a LISTEN the server refused on a connection that is
// still good (a hot standby refuses LISTEN during recovery).
type refusedError struct {
	channel string
	err     error
}

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }
