// Command ent is the orders service of examples/gorm on ent: every created
// order produces an "order.placed" event through an entoutbox rule, written
// in the order's transaction. Some orders are rolled back on purpose; their
// events must never be published. A relay runs in-process and a consumer
// counts what arrives.
//
//	go run ./examples/ent
//
// The ent code in ./ent is generated with the sql/execquery feature
// (see ent/generate.go), which entoutbox needs.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	entgo "entgo.io/ent"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/examples/ent/ent"
	"github.com/acemq/outbox/examples/internal/demo"
)

// OrderPlaced is the event's payload.
type OrderPlaced struct {
	OrderID  int    `json:"order_id"`
	Customer string `json:"customer"`
	Total    int    `json:"total"`
}

// placeOrder is the business transaction: the order and its event commit
// together, or not at all.
func placeOrder(ctx context.Context, client *ent.Client, customer string, total int, outOfStock bool) error {
	tx, err := client.Tx(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Order.Create().SetCustomer(customer).SetTotal(total).Save(ctx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	if outOfStock {
		return errors.Join(demo.ErrOutOfStock, tx.Rollback()) // the order and its event are gone
	}
	return tx.Commit()
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	slogger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	env, err := demo.Start(ctx, "ent")
	if err != nil {
		return err
	}
	defer env.Close()
	db, err := env.SchemaDB()
	if err != nil {
		return err
	}
	defer db.Close()
	dialectName, database := dialect.Postgres, outbox.PostgreSQL
	if demo.MySQL() { // DATABASE_URL=mysql://…
		dialectName, database = dialect.MySQL, outbox.MySQL
	}
	client := ent.NewClient(ent.Driver(entsql.OpenDB(dialectName, db)))
	if err := client.Schema.Create(ctx); err != nil {
		return err
	}

	// The outbox: a rule turns every created order into an event, and the
	// hook writes it through the order's transaction.
	ob, err := entoutbox.New(&entoutbox.Config{Table: env.Schema + ".outbox", Router: outbox.ToExchange(env.Exchange), Database: database})
	if err != nil {
		return err
	}
	ob.On("Order", entgo.OpCreate, func(ctx context.Context, c entoutbox.Change) ([]outbox.Event, error) {
		o := c.Value.(*ent.Order)
		evt, err := outbox.JSON("order.placed", fmt.Sprint(o.ID), OrderPlaced{o.ID, o.Customer, o.Total})
		return []outbox.Event{evt}, err
	})
	client.Use(entoutbox.Hook[*ent.Tx](ob))

	stop, err := env.StartRelay(ctx, slogger)
	if err != nil {
		return err
	}
	defer stop()

	return env.PlaceOrders(ctx, 100, stop, func(customer string, total int, outOfStock bool) error {
		return placeOrder(ctx, client, customer, total, outOfStock)
	})
}
