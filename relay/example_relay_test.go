package relay_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// Example runs a relay as part of a service: it publishes the outbox to
// RabbitMQ until SIGINT or SIGTERM, then shuts down gracefully, releasing
// what it could not confirm so that another relay takes it at once. It has
// no Output: it runs until stopped.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The relay's own pool: never the one your transactions run on.
	db, err := sql.Open("pgx", "postgres://postgres@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox", MaxAttempts: 10})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: "amqp://guest:guest@localhost:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	r, err := relay.New(store, pub, &relay.Config{BatchSize: 500, Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // blocks; nil after a clean shutdown
		log.Fatal(err)
	}
}
