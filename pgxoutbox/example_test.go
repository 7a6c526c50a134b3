package pgxoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/pgxoutbox"
)

// ExampleTx writes an event through a pgxpool transaction, in the same
// transaction as the business change.
func ExampleTx() {
	ctx := context.Background()
	url := dbtest.ExampleURL() // the test database, in a schema of this run's own
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	relayDB, err := sql.Open("pgx", url) // the relay side's own pool
	if err != nil {
		log.Fatal(err)
	}
	defer relayDB.Close()
	store, err := outbox.NewStore(relayDB, &outbox.StoreConfig{Table: "outbox"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil { // in production: a migration
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	// ... the business change: tx.Exec(ctx, "INSERT INTO orders ...")
	if err := store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "order.placed", Key: "order-7"}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	n, err := store.Pending(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", n)
	// Output: pending: 1
}
