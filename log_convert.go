package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Conversion is what ConvertToLog did, or would do.
type Conversion struct {
	// Pending counts the unpublished messages that go into the new table
	// as events, to be published by the next claims.
	Pending int64
	// Failed counts the unpublished messages with failed attempts (parked
	// or backing off) that go into its failed table, with their attempts,
	// last errors and parking, and on an ordered table those held behind
	// them.
	Failed int64
	// History counts the published and discarded messages left behind in
	// the old table, renamed to OldTable.
	History int64
	// OldTable is the name the table of the rows layout is given; it is
	// kept, for its history, until an operator drops it.
	OldTable string
	// DDL is the script that creates the table of the log layout.
	DDL string
	// Took is how long writers waited: the conversion's transaction.
	Took time.Duration
}

// ConvertToLog turns a table of the rows layout into one of the log
// layout, online: in one transaction it renames the table to
// <table>_rows, creates the table of the log layout under the name,
// copies the messages not yet published into it (those that failed at
// least once into its failed table, with their attempts) and moves the
// NOTIFY trigger, if any. Writers wait for that transaction (it takes the
// table's lock, waiting at most lockTimeout, 1ms or more, for the writers
// in progress),
// then write to the new table; relays find the new layout at their next
// statement. Run it while relays keep up: the copy is what writers wait
// for. A message a relay had in flight is published again from the new
// table (a duplicate, never a loss). With dryRun nothing changes and the
// counts are what would be copied now.
//
// An ordered table becomes an ordered table of the log layout: the
// messages waiting are numbered in their order, and a failed message, with
// those held behind it, goes to the failed table, where they keep it.
func (s *Store) ConvertToLog(ctx context.Context, dryRun bool, lockTimeout time.Duration) (Conversion, error) {
	db, err := s.pool()
	if err != nil {
		return Conversion{}, err
	}
	if err := checkLockTimeout("ConvertToLog", lockTimeout); err != nil {
		return Conversion{}, err
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return Conversion{}, err
	}
	return ops.convertToLog(ctx, db, dryRun, lockTimeout)
}

// convertToLog is ConvertToLog of a table of the rows layout.
func (r rowsOps) convertToLog(ctx context.Context, db *sql.DB, dryRun bool, lockTimeout time.Duration) (Conversion, error) {
	s := r.Store
	mode, err := s.TableOrdering(ctx)
	if err != nil {
		return Conversion{}, err
	}
	ordered := mode == OrderedByKey
	old := s.t.name + "_rows"
	if i := strings.IndexByte(s.t.full, '.'); i >= 0 {
		old = s.t.full[:i+1] + old
	}
	oldT, err := parseTable(old)
	if err != nil {
		return Conversion{}, fmt.Errorf("outbox: converting %s: the old table's name: %w", s.t.full, err)
	}
	lt := s.t.logTables()
	c := Conversion{OldTable: old, DDL: s.t.logSQL(lt) + s.t.scheduledSQL()}
	// An ordered table becomes an ordered log table: the copy numbers the
	// rows (ord) in the order of seq, and the failed ones and those held
	// behind them go to the failed table, in that order too; the trigger
	// comes after the copy (see the steps).
	waiting, failing := `attempts = 0 AND parked_at IS NULL`, `attempts > 0 OR parked_at IS NOT NULL`
	tableDDL, orderDDL := c.DDL, ""
	if ordered {
		orderDDL = s.t.logOrderDDL(lt)
		c.DDL += orderDDL
		waiting, failing = waiting+` AND NOT held`, failing+` OR held`
	}
	notify, err := s.HasNotifyTrigger(ctx)
	if err != nil {
		return c, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return c, err
	}
	defer func() { _ = tx.Rollback() }()
	started := time.Now()
	if !dryRun {
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(lockTimeout.Milliseconds(), 1))); err != nil {
			return c, err
		}
		if _, err := tx.ExecContext(ctx, "LOCK TABLE "+s.t.quoted+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return c, fmt.Errorf("outbox: converting %s: taking the table's lock: %w", s.t.full, err)
		}
	}
	err = tx.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL AND `+waiting+`),
	count(*) FILTER (WHERE published_at IS NULL AND (`+failing+`)),
	count(*) FILTER (WHERE published_at IS NOT NULL)
FROM `+s.t.quoted).Scan(&c.Pending, &c.Failed, &c.History)
	if err != nil {
		return c, fmt.Errorf("outbox: converting %s: counting its messages: %w", s.t.full, err)
	}
	if dryRun {
		return c, nil
	}
	var exists bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", oldT.quoted).Scan(&exists); err != nil {
		return c, err
	}
	if exists {
		return c, fmt.Errorf("outbox: converting %s: %s exists already (an earlier conversion's history?): drop or rename it first", s.t.full, old)
	}
	ord, available := `NULL::bigint`, `available_at`
	if ordered { // held ones are due as soon as they are first of their key
		ord, available = `nextval('`+strings.ReplaceAll(lt.ordSeq, "'", "''")+`')`, `CASE WHEN held THEN now() ELSE available_at END`
	}
	steps := []string{
		"ALTER TABLE " + s.t.quoted + " RENAME TO " + `"` + oldT.name + `"`,
		// The sequence goes on numbering the events of the new table.
		"ALTER TABLE " + oldT.quoted + " ALTER COLUMN seq DROP DEFAULT",
		tableDDL,
		// A key's failed message and those held behind it first: a
		// message of the key copied to the events table is set aside
		// behind them when it is claimed, and must come after them in ord.
		`INSERT INTO ` + lt.failed + ` (id, seq, ord, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, last_error, available_at, parked_at)
SELECT id, nextval('` + strings.ReplaceAll(lt.seq, "'", "''") + `'), ` + ord + `, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, last_error, ` + available + `, parked_at FROM (SELECT * FROM ` + oldT.quoted + `
	WHERE published_at IS NULL AND (` + failing + `) ORDER BY seq NULLS FIRST, id) AS o`,
		// Numbered here, not by the order trigger, which is created after
		// the copy: it would take the keys' locks, which writers waiting
		// for this transaction hold (a deadlock).
		`INSERT INTO ` + s.t.quoted + ` (id, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at, ord)
SELECT id, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at, ` + ord + ` FROM (SELECT * FROM ` + oldT.quoted + `
	WHERE published_at IS NULL AND ` + waiting + ` ORDER BY seq NULLS FIRST, id) AS o`,
		orderDDL,
	}
	if ordered {
		// The old table keeps its history, not its writers: its order
		// trigger's function is the new table's now.
		if _, err := tx.ExecContext(ctx, "DROP TRIGGER IF EXISTS "+`"`+s.t.orderTrigger()+`"`+" ON "+s.t.quoted); err != nil {
			return c, err
		}
	}
	if notify {
		// Before the rename (the steps below): the old table keeps no
		// trigger of its writers.
		if _, err := tx.ExecContext(ctx, "DROP TRIGGER IF EXISTS "+`"`+s.t.trigger()+`"`+" ON "+s.t.quoted); err != nil {
			return c, err
		}
		ddl, err := NotifySchema(s.t.full)
		if err != nil {
			return c, err
		}
		steps = append(steps, ddl)
	}
	for _, q := range steps {
		if q == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return c, fmt.Errorf("outbox: converting %s: %w", s.t.full, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return c, fmt.Errorf("outbox: converting %s: %w", s.t.full, err)
	}
	c.Took = time.Since(started)
	s.forgetLayout()
	return c, nil
}

// forgetLayout makes the next relay-side call read the table's layout
// again.
func (s *Store) forgetLayout() {
	s.st.forget()
	s.scheduledMayExist()
}

// relayout forgets the layout when err says that the table is not what the
// statement expected (a column or the table is missing): it may have been
// converted while this Store ran. It returns err.
func (s *Store) relayout(err error) error { return s.st.tableChanged(err) }
