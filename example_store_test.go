package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// ExampleStore_Add writes an event in the same transaction as the business
// change, with database/sql. Rolled back, both are gone; committed, the
// event is there for the relay to claim.
func ExampleStore_Add() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "example_store_outbox"})
	if err != nil {
		log.Fatal(err)
	}
	// For the example only; in production the table comes from a migration.
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		log.Fatal(err)
	}
	defer db.Exec(`DROP TABLE example_store_outbox`) //nolint:errcheck

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	// ... the business change: tx.ExecContext(ctx, "INSERT INTO orders ...")
	evt, _ := outbox.JSON("order.placed", "order-42", map[string]any{"total": 4200})
	if err := store.Add(ctx, tx, evt); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// What a relay does next.
	msgs, err := store.Claim(ctx, 10, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msgs[0].EventType, msgs[0].Key, string(msgs[0].Payload))
	// Output: order.placed order-42 {"total":4200}
}
