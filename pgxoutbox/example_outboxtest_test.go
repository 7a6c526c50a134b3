package pgxoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
	"github.com/acemq/outbox/pgxoutbox"
)

// Example_outboxtest checks, in an application's test, that code writing
// through a native pgx transaction recorded its event: package outboxtest
// reads the pgx.Tx itself (in a test: outboxtest.RequireEvent(t, tx, …)).
func Example_outboxtest() {
	ctx := context.Background()
	url := dbtest.ExampleURL() // the test database, in a schema of this run's own
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	relayDB, _ := sql.Open("pgx", url)
	defer relayDB.Close()
	store, _ := outbox.NewStore(relayDB, &outbox.StoreConfig{Table: "outbox"})
	_ = store.CreateSchemaIfAbsent(ctx)

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)                                                                                       //nolint:errcheck // the test leaves nothing behind
	if err := store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "order.placed", Key: "order-7"}); err != nil { // the code under test
		log.Fatal(err)
	}
	evts, err := outboxtest.Find(ctx, tx, "outbox", outboxtest.Match{Type: "order.placed", Key: "order-7"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(evts), evts[0].Type, evts[0].Key)
	// Output: 1 order.placed order-7
}
