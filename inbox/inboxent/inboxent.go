// Package inboxent lets an inbox handler write with ent in the inbox's
// transaction. With the entoutbox hook on the client, the events its
// mutations carry go into the outbox in that same transaction: consume,
// update and publish become one atomic step.
//
//	ib.Handle(ctx, &d, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
//		client := ent.NewClient(ent.Driver(inboxent.Driver(tx)))
//		client.Use(entoutbox.Hook[*ent.Tx](ob))
//		etx, err := client.Tx(ctx) // the inbox's transaction, as an *ent.Tx
//		if err != nil {
//			return err
//		}
//		return etx.Shipment.Create().SetOrderID(id).Exec(ctx)
//	})
//
// Handle commits or rolls back; the *ent.Tx's Commit and Rollback do
// nothing.
package inboxent

import (
	"context"
	"database/sql"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
)

// Driver returns an ent driver whose statements run in tx, the inbox's
// transaction. Its Tx returns that same transaction, with Commit and
// Rollback that do nothing, so that a client on it can open the *ent.Tx
// that entoutbox's hook and Publish require.
func Driver(tx *sql.Tx) dialect.Driver {
	return DriverOf(dialect.Postgres, tx)
}

// DriverOf is Driver for a database of the given ent dialect:
// dialect.Postgres, or dialect.MySQL for an inbox on MySQL or MariaDB.
func DriverOf(name string, tx *sql.Tx) dialect.Driver {
	return &driver{Conn: entsql.Conn{ExecQuerier: tx}, dialect: name}
}

type driver struct {
	entsql.Conn
	dialect string
}

// Tx returns the inbox's transaction, which the inbox commits.
func (d *driver) Tx(context.Context) (dialect.Tx, error) { return nopTx{d.Conn}, nil }

// Close does nothing: the transaction belongs to the inbox.
func (d *driver) Close() error { return nil }

// Dialect is the dialect the driver was made for (Driver: PostgreSQL).
func (d *driver) Dialect() string { return d.dialect }

// nopTx is the inbox's transaction as an ent dialect.Tx.
type nopTx struct{ entsql.Conn }

func (nopTx) Commit() error   { return nil }
func (nopTx) Rollback() error { return nil }

var (
	_ dialect.Driver = (*driver)(nil)
	_ dialect.Tx     = nopTx{}
)
