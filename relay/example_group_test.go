package relay_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/pgwake"
	"github.com/acemq/outbox/relay"
)

// ExampleGroup relays the outbox of every tenant's schema from one
// process: one pool, one publisher (at most 8 broker connections for all
// of them), a relay for each table, and one LISTEN connection (a
// pgwake.Listener) that wakes each table's relay the moment a write to it
// commits (each table needs the trigger of outbox.NotifySchema; without
// it, leave the Listener out and the relays poll). Tables may be added
// and removed while it runs. It has no Output: it runs until stopped.
func ExampleGroup() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	const url = "postgres://postgres@localhost:5432/app"

	db, err := sql.Open("pgx", url)
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
	l, err := pgwake.NewListener(ctx, &pgwake.ListenerConfig{DatabaseURL: url}) // one connection, until ctx ends
	if err != nil {
		log.Fatal(err)
	}
	for _, table := range []string{"tenant_a.outbox", "tenant_b.outbox"} {
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
		if err != nil {
			log.Fatal(err)
		}
		wake, _, err := l.Subscribe(ctx, table)
		if err != nil {
			log.Fatal(err)
		}
		if err := g.Add(relay.Table{Name: table, Store: store, Wakeup: wake}); err != nil {
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
