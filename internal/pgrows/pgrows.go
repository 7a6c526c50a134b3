// Package pgrows keeps the queue of an outbox table of PostgreSQL's rows
// layout (outbox.LayoutRows): one row per message, updated as it is
// claimed, published, failed and parked. It implements backend.Queue;
// package outbox's Store dispatches to it when the table it opens has
// that layout, and keeps what the two PostgreSQL layouts share (the
// table's DDL, its order trigger and the writers' key turns, the delayed
// messages beside it, the conversion to the log layout).
//
// Claims are one UPDATE each, whose subquery locks its candidates SKIP
// LOCKED for the statement only: the database decides the claim, and a
// message is in at most one live claim. Marks, releases and failures are
// fenced by the claim's token. Claims, marks and releases commit
// asynchronously (pgsql.AsyncCommit): a crash of the server that loses
// one costs duplicates, never a message.
package pgrows

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgschema"
	"github.com/acemq/outbox/internal/pgsql"
)

// Table names the table a Backend keeps.
type Table struct {
	// Quoted is the table's name, qualified as configured and quoted.
	Quoted string
	// OrderedNow is a condition, evaluated once per statement, that holds
	// while the table is ordered (its order trigger is enabled).
	OrderedNow string
}

// Backend is the queue of one table of the rows layout. It is safe for
// concurrent use: it holds nothing but its statements.
type Backend struct {
	q, qo queries // unordered and ordered mode's
	ins   inspectQueries
}

// New returns the Backend of t, its statements built.
func New(t Table) *Backend {
	return &Backend{q: newQueries(t, false), qo: newQueries(t, true), ins: newInspectQueries(t)}
}

// Claim is the claim token a claim wrote in the rows it took.
type Claim string

// Backend implements backend.Claim.
func (Claim) Backend() string { return "postgres-rows" }

var (
	_ backend.Queue      = (*Backend)(nil)
	_ backend.GiveBacker = (*Backend)(nil)
)

func (b *Backend) queries(ordered bool) *queries {
	if ordered {
		return &b.qo
	}
	return &b.q
}

// Texts returns every statement of the mode, by name, for the tests that
// look into them.
func (b *Backend) Texts(ordered bool) map[string]string {
	q := b.queries(ordered)
	return map[string]string{"claim": q.claim, "markPublished": q.markPublished, "release": q.release, "markFailed": q.markFailed,
		"releaseClaim": q.releaseClaim, "pending": q.pending, "stats": q.stats, "parked": q.parked, "retry": q.retry,
		"retryAll": q.retryAll, "purge": q.purge, "purgeable": q.purgeable, "gauges": q.gauges, "discard": q.discard,
		"hold": q.hold, "unhold": q.unhold, "leases": b.ins.leases, "blockedKeys": b.ins.blockedKeys, "keyQueue": b.ins.keyQueue,
		"publishedByMinute": b.ins.publishedByMinute, "held": b.ins.held}
}

// Claim implements backend.Queue: one statement, the rows returned in the
// order of seq (which, on an ordered table, is each key's order).
func (b *Backend) Claim(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, ordered bool) ([]backend.Row, backend.Claim, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, nil, fmt.Errorf("generating claim token: %w", err)
	}
	c := Claim(token.String())
	rows, err := db.QueryContext(ctx, b.queries(ordered).claim, n, lease.Microseconds(), string(c), maxBytes)
	if err != nil {
		return nil, c, err
	}
	claimed, err := pgsql.ScanRows(rows, c)
	slices.SortFunc(claimed, func(x, y backend.Row) int { return cmp.Compare(x.Seq, y.Seq) })
	return claimed, c, err
}

// GiveBack implements backend.GiveBacker.
func (b *Backend) GiveBack(ctx context.Context, db *sql.DB, bc backend.Claim) (int64, error) {
	c, ok := bc.(Claim)
	if !ok {
		return 0, nil
	}
	res, err := db.ExecContext(ctx, b.q.releaseClaim, string(c))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Settle implements backend.Queue: one statement, fenced by the claim's
// token.
func (b *Backend) Settle(ctx context.Context, db *sql.DB, published bool, bc backend.Claim, refs []backend.Ref, ordered bool) ([]int, error) {
	c, ok := bc.(Claim)
	if len(refs) == 0 || !ok {
		return nil, nil // no claim of this backend's: every lease lost
	}
	query := b.q.release
	if published {
		query = b.queries(ordered).markPublished
	}
	rows, err := db.QueryContext(ctx, query, pgsql.IDs(refs), string(c))
	if err != nil {
		return nil, err
	}
	return pgsql.ScanDone(rows, refs)
}

// Fail implements backend.Queue. On an ordered table the later messages
// of the key are held behind the message (SKIP LOCKED: Reconcile holds
// what it skips).
func (b *Backend) Fail(ctx context.Context, db *sql.DB, ref backend.Ref, bc backend.Claim, reason string, delay time.Duration, maxAttempts int, ordered bool) (backend.Failure, bool, error) {
	c, ok := bc.(Claim)
	if !ok {
		return backend.Failure{}, false, nil
	}
	var f backend.Failure
	err := db.QueryRowContext(ctx, b.queries(ordered).markFailed, ref.ID, string(c), reason, delay.Microseconds(), maxAttempts).Scan(&f.Attempts, &f.Parked)
	if errors.Is(err, sql.ErrNoRows) {
		return f, false, nil
	}
	return f, err == nil, err
}

// Maintain implements backend.Queue: a rows table needs no upkeep beside
// its claims.
func (*Backend) Maintain(context.Context, *sql.DB) error { return nil }

// Reconcile implements backend.Queue.
func (b *Backend) Reconcile(ctx context.Context, db *sql.DB, ordered bool) (held, unheld int64, err error) {
	q := b.queries(ordered)
	if ordered {
		if held, err = execCount(ctx, db, q.hold); err != nil {
			return 0, 0, fmt.Errorf("holding the messages of blocked keys: %w", err)
		}
	}
	if unheld, err = execCount(ctx, db, q.unhold); err != nil {
		return held, 0, fmt.Errorf("bringing back held messages: %w", err)
	}
	return held, unheld, nil
}

func execCount(ctx context.Context, db *sql.DB, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Pending implements backend.Queue: one count of each partial index.
func (b *Backend) Pending(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, b.q.pending).Scan(&n)
	return n, err
}

// Counts implements backend.Queue.
func (b *Backend) Counts(ctx context.Context, db *sql.DB, limit int64) (backend.Counts, error) {
	var (
		c              backend.Counts
		oldest, oldRdy float64
	)
	if limit == 0 {
		if err := db.QueryRowContext(ctx, b.q.stats).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Held, &c.Parked,
			&oldest, &oldRdy, &c.PublishedLastHour, &c.BlockedKeys); err != nil {
			return backend.Counts{}, err
		}
	} else if err := db.QueryRowContext(ctx, b.q.gauges, limit).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Held, &c.Parked,
		&oldest, &oldRdy, &c.BlockedKeys); err != nil {
		return backend.Counts{}, err
	}
	c.OldestPending, c.OldestReady = seconds(oldest), seconds(oldRdy)
	return c, nil
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// Parked implements backend.Queue.
func (b *Backend) Parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.q.parked, q.Args()...)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil)
}

// ChangeParked implements backend.Queue.
func (b *Backend) ChangeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	query, args := b.q.retry, []any{ids}
	switch {
	case ids == nil:
		query, args = b.q.retryAll, nil
	case discard:
		query = b.q.discard
	}
	var n int64
	err := db.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

// Purge implements backend.Queue: the cutoff read once, by the database's
// clock, then statements of at most batch rows, oldest first.
func (b *Backend) Purge(ctx context.Context, db *sql.DB, olderThan time.Duration, batch int, progress func(int64)) (int64, error) {
	var cutoff time.Time
	if err := db.QueryRowContext(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, err
	}
	return pgschema.DeleteInBatches(ctx, db, batch, progress, b.q.purge, cutoff)
}

// Purgeable implements backend.Queue.
func (b *Backend) Purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, b.q.purgeable, olderThan.Microseconds()).Scan(&n)
	return n, err
}
