package pgwake_test

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

// ExampleListener wakes the relays of a group of tables, each the moment
// a write to it commits, through one listening connection for all of
// them (each table needs the trigger of outbox.NotifySchema). It has no
// Output: it runs until stopped.
func ExampleListener() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	const url = "postgres://postgres@localhost:5432/app"

	db, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: "amqp://guest:guest@localhost:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	g, err := relay.NewGroup(pub, nil)
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
	if err := g.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
