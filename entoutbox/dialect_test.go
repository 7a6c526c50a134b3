package entoutbox_test

import (
	"context"
	"testing"

	"entgo.io/ent"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/testent"
	"github.com/acemq/outbox/entoutbox/internal/testent/order"
	"github.com/acemq/outbox/internal/mysqltest"
)

// Issue 38, item 4: on MySQL or MariaDB the hook refuses a mutation that
// carries events before it runs, and Publish refuses the transaction,
// saying what is supported; mutations without events pass through.
func TestHookRefusesMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.DB(t)
	client := testent.NewClient(testent.Driver(entsql.OpenDB(dialect.MySQL, db)))
	require.NoError(t, client.Schema.Create(ctx))
	ob, err := entoutbox.New(nil)
	require.NoError(t, err)
	ob.On("Order", ent.OpCreate, orderRule)
	client.Use(entoutbox.Hook[*testent.Tx](ob))

	tx, err := client.Tx(ctx)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // ends the transaction before the database is dropped, if the test fails
	_, err = tx.Order.Create().SetTotal(42).Save(ctx)
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.EqualError(t, err, `entoutbox: Order OpCreate: unsupported database: the database is MySQL or MariaDB (ent dialect "mysql"): PostgreSQL is supported, MySQL and MariaDB are not yet`)
	err = ob.Publish(ctx, tx, evt("order.placed", "1"))
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.ErrorContains(t, err, "entoutbox: Publish: unsupported database")
	_, err = tx.Customer.Create().SetName("ada").Save(ctx)
	require.NoError(t, err, "a mutation without events is not the outbox's")
	require.NoError(t, tx.Commit())
	n, err := client.Order.Query().Where(order.Total(42)).Count(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the refused mutation did not run")
	require.Equal(t, 1, client.Customer.Query().CountX(ctx))
}
