package entoutbox_test

import (
	"context"
	"fmt"
	"testing"

	"entgo.io/ent"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/withext"
	"github.com/acemq/outbox/internal/dbtest"
)

// TestEntcExtension uses the helpers that entcext generates (see
// internal/withext): the Outbox client option, UseOutbox and Tx.Publish.
func TestEntcExtension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, sch := dbtest.SchemaDB(t)
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))

	ob, err := entoutbox.New(nil)
	require.NoError(t, err)
	ob.On("Order", ent.OpCreate, orderRule)
	client := withext.NewClient(withext.Driver(entsql.OpenDB(dialect.Postgres, db)), withext.Outbox(ob))
	require.NoError(t, client.Schema.Create(ctx))
	client.UseOutbox()

	tx, err := client.Tx(ctx)
	require.NoError(t, err)
	o, err := tx.Order.Create().SetTotal(5).Save(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Publish(ctx, evt("invoice.requested", fmt.Sprint(o.ID))))
	require.NoError(t, tx.Commit())
	require.Equal(t, []string{fmt.Sprintf("order.OpCreate/%d", o.ID), fmt.Sprintf("invoice.requested/%d", o.ID)},
		dbtest.EventKeys(t, dbtest.DB(t), sch+".outbox"))

	_, err = client.Order.Create().Save(ctx)
	require.ErrorIs(t, err, outbox.ErrNoTransaction, "the generated hook is the same hook")

	bare := withext.NewClient(withext.Driver(entsql.OpenDB(dialect.Postgres, db)))
	require.PanicsWithValue(t, "ent: UseOutbox: the client has no Outbox; pass ent.Outbox(ob) to NewClient", bare.UseOutbox)
}
