package entoutbox_test

import (
	"context"
	"fmt"
	"log"

	"entgo.io/ent"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/testent"
	"github.com/acemq/outbox/outboxtest"
)

// Example_outboxtest checks, in an application's test, that creating an
// order through ent records order.created in the same transaction: an ent
// Tx generated with the sql/execquery feature is what package outboxtest
// reads (in a test: outboxtest.RequireEvent(t, tx, …)).
func Example_outboxtest() {
	ctx := context.Background()
	client, _, cleanup := exampleClient(ctx) // out of example scope: a client on a fresh schema
	defer cleanup()
	ob, err := entoutbox.New(&entoutbox.Config{Router: outbox.ToExchange("shop")})
	if err != nil {
		log.Fatal(err)
	}
	ob.On("Order", ent.OpCreate, func(ctx context.Context, c entoutbox.Change) ([]outbox.Event, error) {
		o := c.Value.(*testent.Order)
		evt, err := outbox.JSON("order.created", fmt.Sprint(o.ID), map[string]any{"total": o.Total})
		return []outbox.Event{evt}, err
	})
	client.Use(entoutbox.Hook[*testent.Tx](ob))

	tx, err := client.Tx(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()                                                   //nolint:errcheck // the test leaves nothing behind
	if _, err := tx.Order.Create().SetTotal(4200).Save(ctx); err != nil { // the code under test
		log.Fatal(err)
	}
	evts, err := outboxtest.Find(ctx, tx, "outbox", outboxtest.Match{Type: "order.created", Payload: `{"total": 4200}`})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(evts), "order.created in the transaction, to", evts[0].Exchange)
	// Output: 1 order.created in the transaction, to shop
}
