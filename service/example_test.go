package service_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

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
	"github.com/acemq/outbox/service"
	"github.com/acemq/outbox/topology"
)

// Order is the orders service's model; Invoice the billing service's. Each
// records its events with outbox.Recorder.
type Order struct {
	ID    uint
	Total int
	outbox.Recorder
}

type Invoice struct {
	ID      uint
	OrderID string
	outbox.Recorder
}

// Example is two services, each in one call: the orders service places an
// order and relays its "order.placed"; the billing service consumes it
// through its inbox, creates the invoice and announces "invoice.created"
// through its own outbox, in one transaction, and relays that too.
func Example() {
	ctx, stop := context.WithCancel(context.Background()) // in a service: signal.NotifyContext
	exchange, queue, cleanup := exampleNames()            // out of example scope: names of this run's own
	defer cleanup()
	url := amqptest.URL()

	// The billing service: the consumer and its relay.
	billing := exampleDB() // out of example scope: a gorm.DB on a schema of its own, with the tables
	_ = billing.Use(&gormoutbox.Plugin{Router: outbox.ToExchange(exchange)})
	bill := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		inv := &Invoice{OrderID: string(d.Body)}
		inv.Record(outbox.Event{Type: "invoice.created", Key: inv.OrderID})
		return inboxgorm.Tx(billing.WithContext(ctx), tx).Create(inv).Error
	}
	billingDB, _ := billing.DB()
	billingSvc, err := service.New(&service.Config{
		DB: billingDB, AMQPURLs: []string{url},
		Inbox: &inbox.Config{Consumer: "billing"},
		Consumers: []*inbox.ConsumerConfig{{Queue: queue, Handler: bill, Topology: &topology.Topology{Queues: []topology.Queue{
			{Name: queue, Classic: true, Bindings: []topology.Binding{{Exchange: exchange, Key: "order.#"}}},
			{Name: queue + ".invoices", Classic: true, Bindings: []topology.Binding{{Exchange: exchange, Key: "invoice.#"}}}, // another service's
		}}}},
	})
	if err != nil {
		log.Fatal(err)
	}

	// The orders service: the writer and its relay.
	orders := exampleDB()
	_ = orders.Use(&gormoutbox.Plugin{Router: outbox.ToExchange(exchange)})
	ordersDB, _ := orders.DB()
	ordersSvc, err := service.New(&service.Config{DB: ordersDB, AMQPURLs: []string{url}})
	if err != nil {
		log.Fatal(err)
	}

	done := make(chan error, 2)
	go func() { done <- billingSvc.Run(ctx) }()
	go func() { done <- ordersSvc.Run(ctx) }()
	awaitConsumer(queue) // out of example scope: the queue is declared

	order := &Order{Total: 4200}
	order.Record(outbox.Event{Type: "order.placed", Key: "1", Payload: []byte("1")})
	if err := orders.Create(order).Error; err != nil { // the order and its event: one transaction
		log.Fatal(err)
	}

	invoices := awaitInvoices(billing, 1)      // out of example scope: polls the table
	queued := awaitQueued(queue + ".invoices") // and the queue
	stop()
	fmt.Println(<-done, <-done)
	fmt.Printf("%d invoice for order %s; %d invoice.created queued\n", len(invoices), invoices[0].OrderID, queued)
	// Output:
	// <nil> <nil>
	// 1 invoice for order 1; 1 invoice.created queued
}

// exampleNames returns an exchange and a queue of this run's own, the
// exchange declared, and a function that deletes both and closes the
// example's pools.
func exampleNames() (exchange, queue string, cleanup func()) {
	conn, err := amqp.Dial(amqptest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	suffix := fmt.Sprint(time.Now().UnixNano())
	exchange, queue = "example.service."+suffix, "example.service.billing."+suffix
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		log.Fatal(err)
	}
	return exchange, queue, func() {
		conn, err := amqp.Dial(amqptest.URL())
		if err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
				for _, q := range []string{queue + ".dead", queue + ".invoices", queue + ".invoices.dead"} {
					_, _ = ch.QueueDelete(q, false, false, false)
				}
				_ = ch.ExchangeDelete(exchange, false, false)
			}
			_ = conn.Close()
		}
		for _, db := range exampleDBs {
			_ = db.Close()
		}
	}
}

var exampleDBs []*sql.DB

// exampleDB opens a gorm.DB on a schema of this run's own (dbtest drops
// it) and creates the tables: the outbox, the inbox and the models'. In a
// service they come from migrations.
func exampleDB() *gorm.DB {
	db, err := gorm.Open(postgres.Open(dbtest.ExampleURL()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, _ := db.DB()
	exampleDBs = append(exampleDBs, sqlDB)
	store, err := outbox.NewStore(sqlDB, nil)
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(sqlDB, &inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		log.Fatal(err)
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}, &Invoice{}); err != nil {
		log.Fatal(err)
	}
	return db
}

// awaitConsumer waits until the billing consumer has declared its queue
// and consumes it, so that the order's event is routed to it.
func awaitConsumer(queue string) {
	eventually("the billing consumer consumes", func() bool {
		q, err := inspect(queue)
		return err == nil && q.Consumers > 0
	})
}

// awaitInvoices polls the invoices table until it holds n rows.
func awaitInvoices(db *gorm.DB, n int) []Invoice {
	var invoices []Invoice
	eventually("the invoices are created", func() bool {
		return db.Find(&invoices).Error == nil && len(invoices) >= n
	})
	return invoices
}

// awaitQueued returns how many messages the queue holds once it holds
// some.
func awaitQueued(queue string) int {
	var q amqp.Queue
	eventually("the queue receives the event", func() bool {
		var err error
		q, err = inspect(queue)
		return err == nil && q.Messages > 0
	})
	return q.Messages
}

// inspect declares queue passively, on a connection of its own.
func inspect(queue string) (amqp.Queue, error) {
	conn, err := amqp.Dial(amqptest.URL())
	if err != nil {
		return amqp.Queue{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Queue{}, err
	}
	return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// eventually polls cond every 10ms until it holds, for at most 30s.
func eventually(what string, cond func() bool) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	log.Fatalf("not within 30s: %s", what)
}
