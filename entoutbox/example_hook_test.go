package entoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"entgo.io/ent"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/testent"
	"github.com/acemq/outbox/internal/dbtest"
)

// Example shows the quick start: register the hook once, then run
// mutations in a transaction with the events they carry. The order and its
// events commit together; a relay publishes the events afterwards.
func Example() {
	ctx := context.Background()
	client, db, cleanup := exampleClient(ctx) // out of example scope: a client on a fresh schema
	defer cleanup()

	ob, err := entoutbox.New(&entoutbox.Config{Router: outbox.ToExchange("shop")})
	if err != nil {
		log.Fatal(err)
	}
	// A rule: every created order announces itself, with its id.
	ob.On("Order", ent.OpCreate, func(ctx context.Context, c entoutbox.Change) ([]outbox.Event, error) {
		o := c.Value.(*testent.Order)
		evt, err := outbox.JSON("order.created", fmt.Sprint(o.ID), map[string]any{"total": o.Total})
		return []outbox.Event{evt}, err
	})
	client.Use(entoutbox.Hook[*testent.Tx](ob)) // with your code: entoutbox.Hook[*ent.Tx](ob)

	tx, err := client.Tx(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// An event for this mutation only, besides the rule's.
	note := outbox.Event{Type: "checkout.completed", Key: "cart-7"}
	if _, err := tx.Order.Create().SetTotal(4200).Save(entoutbox.WithEvents(ctx, note)); err != nil {
		_ = tx.Rollback()
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	rows, err := db.QueryContext(ctx, "SELECT event_type, exchange FROM outbox ORDER BY id")
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ, exchange string
		if err := rows.Scan(&typ, &exchange); err != nil {
			log.Fatal(err)
		}
		fmt.Println(typ, "->", exchange)
	}
	// Output:
	// checkout.completed -> shop
	// order.created -> shop
}

// exampleClient opens an ent client on a schema of its own and creates the
// tables; in an application the outbox table comes from a migration.
func exampleClient(ctx context.Context) (*testent.Client, *sql.DB, func()) {
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	ddl, _ := outbox.Schema("outbox")
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		log.Fatal(err)
	}
	client := testent.NewClient(testent.Driver(entsql.OpenDB(dialect.Postgres, db)))
	if err := client.Schema.Create(ctx); err != nil {
		log.Fatal(err)
	}
	return client, db, func() {
		db.Close()
	}
}
