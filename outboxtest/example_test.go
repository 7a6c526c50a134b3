package outboxtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
)

// placeOrder is the code under test: it records order.placed in the
// caller's transaction.
func placeOrder(ctx context.Context, store *outbox.Store, tx *sql.Tx, id string, total int) error {
	evt, err := outbox.JSON("order.placed", id, map[string]any{"order_id": id, "total": total})
	if err != nil {
		return err
	}
	return store.Add(ctx, tx, evt)
}

// ExampleFind checks, inside the test's transaction, that the code under
// test recorded its event; in a test, RequireEvent does the same and fails
// the test with what was recorded.
func ExampleFind() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, _ := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox", Router: outbox.ToExchange("shop")})
	_ = store.CreateSchemaIfAbsent(ctx) // in the application: a migration

	tx, _ := db.BeginTx(ctx, nil)
	defer tx.Rollback() //nolint:errcheck // the test leaves nothing behind
	if err := placeOrder(ctx, store, tx, "order-42", 4200); err != nil {
		log.Fatal(err)
	}
	// outboxtest.RequireEvent(t, tx, "outbox", outboxtest.Match{...}) in a test.
	evts, err := outboxtest.Find(ctx, tx, "outbox", outboxtest.Match{Type: "order.placed", Key: "order-42", Payload: `{"total": 4200}`})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(evts), evts[0].Exchange, evts[0].RoutingKey)
	// Output: 1 shop order.placed
}

// ExampleDrain runs the relay's work in-process, without RabbitMQ, and
// shows what would have been published, with its AMQP properties.
func ExampleDrain() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, _ := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox", Router: outbox.ToExchange("shop")})
	_ = store.CreateSchemaIfAbsent(ctx)
	tx, _ := db.BeginTx(ctx, nil)
	_ = placeOrder(ctx, store, tx, "order-7", 700)
	_ = tx.Commit()

	pub := &outboxtest.Publisher{}
	n, err := outboxtest.Drain(ctx, store, pub)
	if err != nil {
		log.Fatal(err)
	}
	m := pub.Messages()[0]
	fmt.Println(n, m.Exchange, m.RoutingKey, m.Type, m.DeliveryMode == amqp.Persistent, m.Headers["x-event-key"])
	// Output: 1 shop order.placed order.placed true order-7
}

// ExampleDeliver hands the inbox one message three times, as a broker may
// after a lost ack: the handler's effect happens once.
func ExampleDeliver() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ib, _ := inbox.New(db, &inbox.Config{Consumer: "billing"})
	_ = ib.CreateSchemaIfAbsent(ctx)
	_, _ = db.Exec(`CREATE TABLE charges (order_id text)`)

	charge := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO charges VALUES ($1)`, string(d.Body))
		return err
	}
	got, err := outboxtest.Deliver(ctx, ib, amqp.Delivery{MessageId: "evt-1", Body: []byte("order-7")}, charge, 3)
	if err != nil {
		log.Fatal(err)
	}
	for _, got := range got {
		fmt.Println(got.Outcome, got.Settled)
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println(n, "charge")
	// Output:
	// handled ack
	// duplicate ack
	// duplicate ack
	// 1 charge
}
