package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgschema"
	"github.com/acemq/outbox/internal/textcut"
)

// layoutOps is the seam between a Store and the SQL of its table's layout.
// Store validates what it is given and holds what every layout shares (the
// table's name, its configuration, the wake-ups); the layout the table
// records (see Store.Layout) decides which implementation does the work:
// rowsOps for LayoutRows, logOps for LayoutLog. No method of Store asks
// which layout it has. The errors of settle, markFailed and maintain are
// complete; the others' are wrapped by Store, which names the operation.
type layoutOps interface {
	// claim takes up to n messages for lease; its error is classified
	// (see Store.relayout, Store.logFault).
	claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error)
	// settle records kind 'p' (published) or 'r' (released) for claimed
	// messages (Store has checked that each carries a claim), and a
	// *LeaseLostError for those whose claim was lost.
	settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error
	// markFailed counts a failed attempt at a claimed message.
	markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error
	// maintain does the upkeep beside the claims (see Store.Maintain).
	maintain(ctx context.Context, db *sql.DB) error
	pending(ctx context.Context, db *sql.DB) (int64, error)
	stats(ctx context.Context, db *sql.DB) (Stats, error)
	gauges(ctx context.Context, db *sql.DB, limit int64) (Gauges, error)
	parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]Message, error)
	// changeParked retries (or discards) the parked messages among ids,
	// every parked message when ids is nil.
	changeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error)
	reconcile(ctx context.Context, db *sql.DB) (held, unheld int64, err error)
	purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error)
	purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error)

	// orderColumn is the column that numbers a key's messages in their
	// order on an ordered table.
	orderColumn() string
	// readOrder reads the table's order (see Store.readOrderOf) and
	// records its mode.
	readOrder(ctx context.Context, db *sql.DB) (tableOrder, error)
	convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, lockTimeout time.Duration) (OrderingConversion, error)
	// createRowsSchema is CreateRowsSchemaIfAbsent: the rows layout's DDL
	// applied, nothing on another layout.
	createRowsSchema(ctx context.Context, db *sql.DB) error
	convertToLog(ctx context.Context, db *sql.DB, dryRun bool, lockTimeout time.Duration) (Conversion, error)
}

// ops returns the operations of the table's layout, read from the table
// (once, see Store.layout).
func (s *Store) ops(ctx context.Context) (layoutOps, error) {
	if s.be != nil {
		return backendOps{s}, nil
	}
	ls, err := s.logged(ctx)
	switch {
	case err != nil:
		return nil, err
	case ls != nil:
		return logOps{ls}, nil
	}
	return rowsOps{s}, nil
}

// dbOps is ops with the store's pool.
func (s *Store) dbOps(ctx context.Context) (*sql.DB, layoutOps, error) {
	db, err := s.pool()
	if err != nil {
		return nil, nil, err
	}
	ops, err := s.ops(ctx)
	return db, ops, err
}

// rowsOps is LayoutRows: one row per message, updated as it is claimed,
// published, failed and parked.
type rowsOps struct{ *Store }

func (r rowsOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	s := r.Store
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("generating claim token: %w", err)
	}
	msgs, err := s.claimRows(ctx, db, n, lease, token.String())
	if err == nil {
		sortBySeq(msgs)
		msgs, err = s.parkUnfit(ctx, db, token.String(), msgs)
	}
	if err != nil {
		s.giveBack(ctx, db, s.q.releaseClaim, token.String(), err, false) // see orphan.go
		return nil, s.relayout(err)
	}
	return msgs, nil
}

// settle runs the UPDATE of kind for the messages of each claim token
// and reports the messages that matched no row as lost leases.
func (r rowsOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	s := r.Store
	query := s.q.release
	if kind == 'p' {
		query = s.queriesNow().markPublished
	}
	var (
		tokens []rowsClaim // in order of first appearance
		ids    = make(map[rowsClaim][]string)
		done   = make(map[string]bool, len(msgs))
	)
	for _, m := range msgs {
		token, ok := m.claim.(rowsClaim)
		if !ok {
			continue // claimed from a table of another layout: lost below
		}
		if _, ok := ids[token]; !ok {
			tokens = append(tokens, token)
		}
		ids[token] = append(ids[token], m.ID)
	}
	for _, token := range tokens {
		if err := s.fencedClaim(ctx, db, query, ids[token], string(token), done); err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), s.t.full, s.relayout(err))
		}
	}
	if len(done) == len(msgs) {
		return nil
	}
	var lost []string
	for _, m := range msgs {
		if !done[m.ID] {
			lost = append(lost, m.ID)
		}
	}
	return s.leaseLost(ctx, what, lost)
}

func (r rowsOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	s := r.Store
	token, ok := msg.claim.(rowsClaim)
	if !ok { // claimed from a table of another layout
		return s.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	reason = textcut.Cut(strings.ReplaceAll(reason, "\x00", ""), lastErrorMax) // a NUL cannot be stored
	delay := s.backoff(msg.Attempts + 1)
	var (
		attempts int
		parked   bool
	)
	err := db.QueryRowContext(ctx, s.queriesNow().markFailed, msg.ID, string(token), reason, delay.Microseconds(), s.maxAttempts).Scan(&attempts, &parked)
	if errors.Is(err, sql.ErrNoRows) {
		return s.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	if err != nil {
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, s.t.full, s.relayout(err))
	}
	if parked {
		s.warnParked(ctx, msg.ID, attempts, reason)
	}
	return nil
}

func (rowsOps) maintain(context.Context, *sql.DB) error { return nil }

func (r rowsOps) pending(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, r.q.pending).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting pending messages in %s: %w", r.t.full, err)
	}
	return n, nil
}

func (r rowsOps) stats(ctx context.Context, db *sql.DB) (Stats, error) {
	s := r.Store
	var (
		st             Stats
		oldest, oldRdy float64
	)
	if err := db.QueryRowContext(ctx, s.q.stats).Scan(&st.Ready, &st.InFlight, &st.Retrying, &st.Held, &st.Parked,
		&oldest, &oldRdy, &st.PublishedLastHour, &st.BlockedKeys); err != nil {
		return Stats{}, fmt.Errorf("outbox: reading stats of %s: %w", s.t.full, err)
	}
	st.Pending = st.Ready + st.InFlight + st.Retrying + st.Held + st.Parked
	st.Claimed = st.InFlight
	st.OldestPendingAge, st.OldestReadyAge = seconds(oldest), seconds(oldRdy)
	return st, nil
}

func (r rowsOps) gauges(ctx context.Context, db *sql.DB, limit int64) (Gauges, error) {
	s := r.Store
	g := Gauges{Limit: limit}
	var oldest, oldRdy float64
	if err := db.QueryRowContext(ctx, s.q.gauges, limit).Scan(&g.Ready, &g.InFlight, &g.Retrying, &g.Held, &g.Parked,
		&oldest, &oldRdy, &g.BlockedKeys); err != nil {
		return Gauges{}, fmt.Errorf("outbox: reading gauges of %s: %w", s.t.full, err)
	}
	g.Pending = min(g.Ready+g.InFlight+g.Retrying+g.Held+g.Parked, limit)
	g.OldestPendingAge, g.OldestReadyAge = seconds(oldest), seconds(oldRdy)
	return g, nil
}

func (r rowsOps) parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]Message, error) {
	rows, err := db.QueryContext(ctx, r.q.parked, q.Args()...)
	if err != nil {
		return nil, err
	}
	return scanMessages(rows, nil)
}

func (r rowsOps) changeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	query, args := r.q.retry, []any{ids}
	switch {
	case ids == nil:
		query, args = r.q.retryAll, nil
	case discard:
		query = r.q.discard
	}
	var n int64
	err := db.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

func (r rowsOps) reconcile(ctx context.Context, db *sql.DB) (held, unheld int64, err error) {
	s := r.Store
	q := s.queriesNow()
	if s.Ordering() == OrderedByKey {
		if held, err = s.execCount(ctx, db, "holding the messages of blocked keys", q.hold); err != nil {
			return 0, 0, err
		}
	}
	if unheld, err = s.execCount(ctx, db, "bringing back held messages", q.unhold); err != nil {
		return held, 0, err
	}
	return held, unheld, nil
}

func (r rowsOps) purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error) {
	s := r.Store
	var cutoff time.Time
	if err := db.QueryRowContext(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: purging %s: %w", s.t.full, err)
	}
	total, err := pgschema.DeleteInBatches(ctx, db, s.purgeBatch, progress, s.q.purge, cutoff)
	if err != nil {
		return total, fmt.Errorf("outbox: purging published messages in %s: %w", s.t.full, err)
	}
	return total, nil
}

func (r rowsOps) purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	s := r.Store
	var n int64
	if err := db.QueryRowContext(ctx, s.q.purgeable, olderThan.Microseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", s.t.full, err)
	}
	return n, nil
}

func (rowsOps) orderColumn() string { return "seq" }

func (r rowsOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	return r.readOrderOf(ctx, db, "seq")
}

// convertOrdering (order_table.go), createRowsSchema (operate.go) and
// convertToLog (log_convert.go) are beside the Store methods they serve.

// logOps is LayoutLog: an insert-only, partitioned events table, its
// batches, settles and failed messages beside it (see logStore).
type logOps struct{ *logStore }

func (l logOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	msgs, err := l.logStore.claim(ctx, db, n, lease)
	return msgs, l.s.logFault(ctx, err)
}

func (l logOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	return l.s.logFault(ctx, l.logStore.settle(ctx, db, what, kind, msgs))
}

func (l logOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	return l.s.logFault(ctx, l.logStore.markFailed(ctx, db, msg, reason))
}

func (l logOps) maintain(ctx context.Context, db *sql.DB) error {
	if err := l.tend(ctx, db); err != nil {
		return fmt.Errorf("outbox: maintaining %s: %w", l.s.t.full, l.s.logFault(ctx, err))
	}
	return nil
}

func (l logOps) pending(ctx context.Context, db *sql.DB) (int64, error) {
	c, err := l.counts(ctx, db, 1<<62)
	return c.pending(), err
}

// reconcile does nothing: nothing is held in a log table (see divert);
// Maintain rotates it.
func (logOps) reconcile(context.Context, *sql.DB) (held, unheld int64, err error) { return 0, 0, nil }

func (l logOps) purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error) {
	n, err := l.logStore.purge(ctx, db, olderThan)
	if err != nil {
		return n, fmt.Errorf("outbox: purging published messages in %s: %w", l.s.t.full, err)
	}
	if progress != nil {
		progress(n)
	}
	return n, nil
}

func (logOps) orderColumn() string { return "ord" }

func (l logOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	return l.s.readOrderOf(ctx, db, "ord")
}

func (l logOps) convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, lockTimeout time.Duration) (OrderingConversion, error) {
	return l.s.convertLogOrdering(ctx, db, l.logStore, to, dryRun, lockTimeout)
}

// createRowsSchema does nothing: a table of the log layout exists.
func (logOps) createRowsSchema(context.Context, *sql.DB) error { return nil }

func (l logOps) convertToLog(context.Context, *sql.DB, bool, time.Duration) (Conversion, error) {
	return Conversion{}, fmt.Errorf("outbox: %s has the %s layout already", l.s.t.full, LayoutLog)
}
