package relay_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// ExampleGroup relays the outbox of every tenant's schema from one
// process: one pool, one publisher (at most 8 broker connections for all
// of them), a relay for each table. Tables may be added and removed while
// it runs. It has no Output: it runs until stopped.
func ExampleGroup() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	db, err := sql.Open("pgx", "postgres://postgres@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: "amqp://guest:guest@localhost:5672/", MaxConnections: 8})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	g, err := relay.NewGroup(pub, &relay.GroupConfig{Config: relay.Config{BatchSize: 500}})
	if err != nil {
		log.Fatal(err)
	}
	for _, table := range []string{"tenant_a.outbox", "tenant_b.outbox"} {
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
		if err != nil {
			log.Fatal(err)
		}
		if err := g.Add(relay.Table{Name: table, Store: store}); err != nil {
			log.Fatal(err)
		}
	}
	if err := g.Run(ctx); err != nil { // blocks; nil after a clean shutdown
		log.Fatal(err)
	}
	for table, h := range g.Health() {
		if h.Err != nil {
			log.Printf("%s: %v", table, h.Err)
		}
	}
}
