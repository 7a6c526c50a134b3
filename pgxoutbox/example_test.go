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
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	relayDB, err := sql.Open("pgx", dbtest.URL()) // the relay side's own pool
	if err != nil {
		log.Fatal(err)
	}
	defer relayDB.Close()
	store, err := outbox.NewStore(relayDB, &outbox.StoreConfig{Table: "example_pgx_outbox"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil { // in production: a migration
		log.Fatal(err)
	}
	defer relayDB.Exec(`DROP TABLE example_pgx_outbox`) //nolint:errcheck

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
