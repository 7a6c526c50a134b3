package inboxgorm_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/inbox/inboxgorm"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Parcel is the shipping service's model; it records its own events.
type Parcel struct {
	ID      uint
	OrderID string
	outbox.Recorder
}

// Example_consumeUpdatePublish is the chain the two halves make: the
// shipping service consumes "order.paid", creates a parcel and announces
// "parcel.created", in one transaction. Delivered twice, the message has
// its effect, and its event, once.
func Example_consumeUpdatePublish() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: db}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	// The shipping service writes its events with the GORM plugin...
	if err := gdb.Use(&gormoutbox.Plugin{Table: "outbox"}); err != nil {
		log.Fatal(err)
	}
	store, _ := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox"})
	_ = store.CreateSchemaIfAbsent(ctx) // in production: migrations
	_ = gdb.Table("parcels").AutoMigrate(&Parcel{})
	// ...and consumes through an inbox.
	ib, _ := inbox.New(db, &inbox.Config{Consumer: "shipping", Table: "inbox"})
	_ = ib.CreateSchemaIfAbsent(ctx)

	ship := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		p := &Parcel{OrderID: string(d.Body)}
		p.Record(outbox.Event{Type: "parcel.created", Key: p.OrderID})
		return inboxgorm.Tx(gdb.WithContext(ctx), tx).Table("parcels").Create(p).Error
	}

	// "order.paid" for order 42 arrives twice, as at-least-once allows.
	conn, err := amqp.Dial(amqptest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	q, _ := ch.QueueDeclare("", false, true, true, false, nil)
	deliveries, _ := ch.Consume(q.Name, "", false, true, false, false, nil)
	for range 2 {
		_ = ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{MessageId: "order-paid-42", Type: "order.paid", Body: []byte("42")})
	}
	for range 2 {
		d := <-deliveries
		outcome, err := ib.Handle(ctx, &d, ship)
		fmt.Println(outcome, err)
	}

	var parcels, events int
	_ = db.QueryRow(`SELECT count(*) FROM parcels`).Scan(&parcels)
	_ = db.QueryRow(`SELECT count(*) FROM outbox WHERE event_type = 'parcel.created'`).Scan(&events)
	fmt.Printf("%d parcel, %d parcel.created event\n", parcels, events)
	// Output:
	// handled <nil>
	// duplicate <nil>
	// 1 parcel, 1 parcel.created event
}
