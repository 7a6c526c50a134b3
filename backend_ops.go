package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/mysqlstore"
)

// backendOps is a table kept by a backend of package backend: MySQL's.
type backendOps struct {
	queueOps
	be backend.Backend
}

// readOrder reads whether the table is ordered (has its order trigger).
// Its order is numbered by the keys' turns, never by a sequence that
// caches: the checks of PostgreSQL's sequences pass.
func (b backendOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	ordered, err := b.be.Ordered(ctx, db)
	if err != nil {
		return tableOrder{}, fmt.Errorf("outbox: reading the order of %s: %w", b.t.full, err)
	}
	return tableOrder{ordered: ordered, hasSeq: true, cache: sql.NullInt64{Int64: 1, Valid: true}}, nil
}

// takeTurns is Store.Add's lockKeys on a backend's table: the writer takes
// the turns of its keys in sorted order before it writes, so that one call
// never deadlocks by itself, when the store is ordered or the table was
// last read ordered and the call has several keys. (A writer that does not
// take them first takes them row by row in the trigger: two transactions
// writing keys A and B in opposite orders can deadlock, and MySQL aborts
// one, error 1213.)
func (b backendOps) takeTurns(ctx context.Context, tx Execer, evts []Event) error {
	if b.order.configured != OrderedByKey && (len(evts) < 2 || b.Ordering() != OrderedByKey) {
		return nil
	}
	var keys []string
	for i := range evts {
		if evts[i].Key != "" {
			keys = append(keys, evts[i].Key)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if len(keys) == 0 || (len(keys) < 2 && b.order.configured != OrderedByKey) {
		return nil
	}
	bind := make([]any, len(keys))
	for i, k := range keys {
		bind[i] = k
	}
	if _, err := tx.ExecContext(ctx, b.be.KeyTurnSQL(len(keys)), bind...); err != nil {
		return fmt.Errorf("outbox: taking the keys of %d event(s) in %s: %w", len(evts), b.t.full, err)
	}
	return nil
}

// errNotOnBackend is what the operations that only PostgreSQL has return
// on another database.
func (b backendOps) errNotOnBackend(what string) error {
	return fmt.Errorf("outbox: %s: %w: %s is on %s, where tables are unordered and of LayoutRows", what, ErrUnsupportedDatabase, b.t.full, b.database)
}

func (b backendOps) convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, _ time.Duration) (OrderingConversion, error) {
	from, err := b.TableOrdering(ctx)
	if err != nil {
		return OrderingConversion{}, err
	}
	b.order.observe(from)
	c := OrderingConversion{From: from, To: to}
	if from != to {
		stmts := b.be.UnorderStatements()
		if to == OrderedByKey {
			stmts = b.be.OrderStatements()
		}
		c.DDL = mysqlstore.Script(stmts)
	}
	st, err := b.stats(ctx, db)
	if err != nil {
		return c, err
	}
	c.Pending, c.Held = st.Pending, st.Held
	if dryRun || from == to {
		return c, nil
	}
	start := time.Now()
	if err := b.be.SetOrdered(ctx, db, to == OrderedByKey); err != nil {
		return c, fmt.Errorf("outbox: converting %s to %s: %w", b.t.full, to, err)
	}
	c.Took = time.Since(start)
	b.order.observe(to)
	return c, nil
}

func (b backendOps) createRowsSchema(ctx context.Context, db *sql.DB) error {
	for _, st := range append(b.be.SchemaStatements(), b.be.ScheduleStatements()...) {
		if _, err := db.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("outbox: creating schema of %s: %w", b.t.full, err)
		}
	}
	if b.order.configured != OrderedByKey {
		return nil
	}
	if err := b.be.SetOrdered(ctx, db, true); err != nil {
		return fmt.Errorf("outbox: making %s an ordered table: %w", b.t.full, err)
	}
	b.order.observe(OrderedByKey)
	return nil
}

func (b backendOps) convertToLog(context.Context, *sql.DB, bool, time.Duration) (Conversion, error) {
	return Conversion{}, b.errNotOnBackend("converting to the log layout")
}
