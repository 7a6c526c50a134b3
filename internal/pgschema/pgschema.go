// Package pgschema applies the DDL of the module's tables (the outbox's and
// the inbox's) and deletes their old rows in batches: one copy of each for
// every table.
package pgschema

import (
	"context"
	"database/sql"
)

// Apply runs ddl in one transaction that first takes an advisory lock on
// lock: concurrent CREATE … IF NOT EXISTS of one table can still collide
// in the catalog, and the lock makes them take turns.
func Apply(ctx context.Context, db *sql.DB, lock, ddl string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", lock); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return err
	}
	return tx.Commit()
}

// DeleteInBatches runs del, a DELETE of at most batch rows (its last
// argument), until it deletes fewer, calling progress (when not nil) with
// the running total after every batch that deleted something. It returns
// the total.
func DeleteInBatches(ctx context.Context, db *sql.DB, batch int, progress func(total int64), del string, args ...any) (int64, error) {
	args = append(args, batch)
	var total int64
	for {
		res, err := db.ExecContext(ctx, del, args...)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil {
			return total, err
		}
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}
