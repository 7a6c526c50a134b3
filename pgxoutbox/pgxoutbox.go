// Package pgxoutbox lets outbox.Store.Add write through a native pgx
// transaction (pgx.Tx from pgx.Conn.Begin or pgxpool.Pool.Begin), for
// applications that use pgx without database/sql.
//
//	tx, err := pool.Begin(ctx)
//	if err != nil { … }
//	defer tx.Rollback(ctx)
//	// … the business change, through tx …
//	if err := store.Add(ctx, pgxoutbox.Tx(tx), evt); err != nil { … }
//	return tx.Commit(ctx)
//
// database/sql users (the "pgx" stdlib driver, GORM, ent) do not need it:
// their *sql.Tx is accepted as it is.
package pgxoutbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acemq/outbox"
)

// Tx adapts a pgx transaction to outbox.Execer. Commit and Rollback of the
// adapter commit and roll back tx (without a deadline); prefer calling them
// on tx itself with your context. Tx(nil) is refused by Add with
// outbox.ErrNoTransaction.
func Tx(tx pgx.Tx) outbox.Execer {
	if tx == nil {
		return (*adapter)(nil)
	}
	return &adapter{tx: tx}
}

type adapter struct{ tx pgx.Tx }

// ExecContext runs query in the transaction.
func (a *adapter) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := a.tx.Exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return result(tag), nil
}

// Commit commits the transaction.
func (a *adapter) Commit() error { return a.tx.Commit(context.Background()) }

// Rollback rolls the transaction back.
func (a *adapter) Rollback() error { return a.tx.Rollback(context.Background()) }

type result pgconn.CommandTag

func (r result) LastInsertId() (int64, error) { return 0, errNoLastInsertID }

func (r result) RowsAffected() (int64, error) { return pgconn.CommandTag(r).RowsAffected(), nil }

var errNoLastInsertID = errors.New("pgxoutbox: LastInsertId is not supported by PostgreSQL")
