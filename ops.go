package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/acemq/outbox/internal/backend"
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

	// What an operator looks at (inspect.go): see backend.Inspector.
	leases(ctx context.Context, db *sql.DB, limit int) ([]backend.Lease, error)
	blockedKeys(ctx context.Context, db *sql.DB, limit int) ([]backend.BlockedKey, error)
	keyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]QueuedMessage, error)
	publishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error)
	held(ctx context.Context, db *sql.DB, q backend.HeldQuery) ([]Message, error)
}

// ops returns the operations of the table's kind (see storage).
func (s *Store) ops(ctx context.Context) (layoutOps, error) { return s.st.ops(ctx) }

// dbOps is ops with the store's pool.
func (s *Store) dbOps(ctx context.Context) (*sql.DB, layoutOps, error) {
	db, err := s.pool()
	if err != nil {
		return nil, nil, err
	}
	ops, err := s.ops(ctx)
	return db, ops, err
}

// rowsOps is LayoutRows on PostgreSQL: one row per message, updated as
// it is claimed, published, failed and parked, its queue kept by package
// pgrows.
type rowsOps struct{ queueOps }

func (r rowsOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	return r.readOrderOf(ctx, db, "seq")
}

// convertOrdering (order_table.go), createRowsSchema (operate.go) and
// convertToLog (log_convert.go) are beside the Store methods they serve.

// logOps is LayoutLog on PostgreSQL: an insert-only, partitioned events
// table, its batches, settles and failed messages beside it, its queue
// kept by package pglog. Its errors that say an object is missing are
// explained by the table's check (logFault).
type logOps struct {
	queueOps
	l logTables // the table's objects, as read from it
}

func (l logOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	msgs, err := l.queueOps.claim(ctx, db, n, lease)
	return msgs, l.logFault(ctx, err)
}

func (l logOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	return l.logFault(ctx, l.queueOps.settle(ctx, db, what, kind, msgs))
}

func (l logOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	return l.logFault(ctx, l.queueOps.markFailed(ctx, db, msg, reason))
}

func (l logOps) maintain(ctx context.Context, db *sql.DB) error {
	if err := l.q.Maintain(ctx, db); err != nil {
		return fmt.Errorf("outbox: maintaining %s: %w", l.t.full, l.logFault(ctx, err))
	}
	return nil
}

func (logOps) orderColumn() string { return "ord" }

func (l logOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	return l.readOrderOf(ctx, db, "ord")
}

// convertOrdering is in order_table.go.

// createRowsSchema does nothing: a table of the log layout exists.
func (logOps) createRowsSchema(context.Context, *sql.DB) error { return nil }

func (l logOps) convertToLog(context.Context, *sql.DB, bool, time.Duration) (Conversion, error) {
	return Conversion{}, fmt.Errorf("outbox: %s has the %s layout already", l.t.full, LayoutLog)
}
