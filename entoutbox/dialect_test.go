package entoutbox_test

import (
	"context"
	"testing"
	"time"

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

// Issue 41: ent on MySQL or MariaDB. The hook of an Outbox configured
// for MySQL writes a mutation's events in its transaction; a rolled-back
// transaction leaves neither; one configured for PostgreSQL refuses the
// mutation before it runs, saying why.
func TestHookOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mysqltest.DB(t)
	client := testent.NewClient(testent.Driver(entsql.OpenDB(dialect.MySQL, db)))
	require.NoError(t, client.Schema.Create(ctx))
	relayStore, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	require.NoError(t, relayStore.CreateSchemaIfAbsent(ctx))

	ob, err := entoutbox.New(&entoutbox.Config{Database: outbox.MySQL})
	require.NoError(t, err)
	ob.On("Order", ent.OpCreate, orderRule)
	client.Use(entoutbox.Hook[*testent.Tx](ob))

	tx, err := client.Tx(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().SetTotal(42).Save(ctx)
	require.NoError(t, err)
	require.NoError(t, ob.Publish(ctx, tx, evt("order.noted", "1")))
	require.NoError(t, tx.Commit())

	tx, err = client.Tx(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().SetTotal(7).Save(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	msgs, err := relayStore.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "the committed order's event and the published one")
	require.Equal(t, "order.noted", msgs[1].EventType)

	// An Outbox of PostgreSQL's (the default) on a MySQL client.
	pg, err := entoutbox.New(nil)
	require.NoError(t, err)
	pg.On("Order", ent.OpCreate, orderRule)
	client2 := testent.NewClient(testent.Driver(entsql.OpenDB(dialect.MySQL, db)))
	client2.Use(entoutbox.Hook[*testent.Tx](pg))
	tx, err = client2.Tx(ctx)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // ends the transaction before the database is dropped, if the test fails
	_, err = tx.Order.Create().SetTotal(99).Save(ctx)
	require.EqualError(t, err, `entoutbox: Order OpCreate: the outbox store's database is PostgreSQL, and the ent dialect is "mysql": configure the store with the database it writes to (outbox.StoreConfig.Database)`)
	require.NoError(t, tx.Rollback())
	n, err := client.Order.Query().Where(order.Total(99)).Count(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the refused mutation did not run")

	// A dialect the library does not support at all.
	_, err = outbox.NewStore(nil, &outbox.StoreConfig{Database: 9})
	require.ErrorContains(t, err, "StoreConfig.Database must be PostgreSQL or MySQL")
}
