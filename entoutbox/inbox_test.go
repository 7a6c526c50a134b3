package entoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/testent"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/inbox/inboxent"
	"github.com/acemq/outbox/internal/amqptest"
)

// Issue 12, item 4: with ent, consume → update → publish is one atomic
// step: an *ent.Tx on the inbox's transaction writes the order and, through
// the hook, its event; a failing handler rolls both back.
func TestInboxHandlerWithEnt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	ib, err := inbox.New(b.db, &inbox.Config{Consumer: "orders", Table: b.schema + ".inbox", MaxAttempts: 2})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))

	ch, queue, deliveries := amqptest.ManualQueue(t, "payments")
	require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: "payment-1", Body: []byte("7")}))

	handler := func(fail bool) inbox.Handler {
		return func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			client := testent.NewClient(testent.Driver(inboxent.Driver(tx)))
			client.Use(entoutbox.Hook[*testent.Tx](b.ob))
			etx, err := client.Tx(ctx)
			if err != nil {
				return err
			}
			if _, err := etx.Order.Create().SetTotal(7).Save(entoutbox.WithEvents(ctx, evt("order.paid", d.MessageId))); err != nil {
				return err
			}
			if fail {
				return errors.New("ledger unavailable")
			}
			return etx.Commit() // does nothing: the inbox commits
		}
	}

	d := <-deliveries
	o, err := ib.Handle(ctx, &d, handler(true))
	require.Equal(t, inbox.Retried, o)
	require.ErrorContains(t, err, "ledger unavailable")
	require.Zero(t, b.count(t, "orders"), "the failed handler's order rolled back")
	require.Empty(t, b.events(t), "and its event with it")

	d = <-deliveries
	o, err = ib.Handle(ctx, &d, handler(false))
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.EqualValues(t, 1, b.count(t, "orders"))
	require.Equal(t, []string{"order.paid/payment-1"}, b.events(t), "the event was written in the inbox's transaction")
}
