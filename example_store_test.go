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
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox"})
	if err != nil {
		log.Fatal(err)
	}
	// For the example only; in production the table comes from a migration.
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		log.Fatal(err)
	}

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

// ExampleOrderedByKey shows ordered mode: a key's messages are claimed only
// in the order they were written, a failed one holds back the rest of its
// key while other keys go on, and giving up on it (Discard) lets them go.
func ExampleOrderedByKey() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewStore(db, &outbox.StoreConfig{
		Table:       "outbox",
		Ordering:    outbox.OrderedByKey, // on every Store of the table: writers and relays
		MaxAttempts: 1,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Add(ctx, tx,
		outbox.Event{Type: "order.placed", Key: "order-1"},
		outbox.Event{Type: "order.placed", Key: "order-2"},
		outbox.Event{Type: "order.shipped", Key: "order-1"},
	); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	claim := func() []outbox.Message {
		msgs, err := store.Claim(ctx, 10, 30*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range msgs {
			fmt.Println("claimed", m.Key, m.EventType)
		}
		return msgs
	}

	msgs := claim()
	// order-1's first message fails (and, at MaxAttempts 1, is parked);
	// the relay gives back the rest of its key.
	if err := store.MarkFailed(ctx, msgs[0], "NO_ROUTE"); err != nil {
		log.Fatal(err)
	}
	if err := store.MarkPublished(ctx, msgs[1]); err != nil {
		log.Fatal(err)
	}
	if err := store.Release(ctx, msgs[2]); err != nil {
		log.Fatal(err)
	}
	claim() // nothing: order.shipped waits behind order.placed
	st, err := store.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("blocked keys:", st.BlockedKeys, "held:", st.Held)

	if _, err := store.Discard(ctx, msgs[0].ID); err != nil {
		log.Fatal(err)
	}
	claim()
	// Output:
	// claimed order-1 order.placed
	// claimed order-2 order.placed
	// claimed order-1 order.shipped
	// blocked keys: 1 held: 1
	// claimed order-1 order.shipped
}

// ExampleEvent_notBefore delays an event: it commits with the transaction,
// waits beside the table until it is due (a relay's Maintain then moves it
// in), and no claim sees it before.
func ExampleEvent_notBefore() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dbtest.ExampleURL()) // the test database, in a schema of this run's own
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "reminders"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil { // for the example only
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	evt, _ := outbox.JSON("order.reminder", "order-42", map[string]any{"order": 42})
	evt.NotBefore = time.Now().Add(500 * time.Millisecond) // tomorrow, in a real application
	if err := store.Add(ctx, tx, evt); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	st, _ := store.Stats(ctx)
	msgs, _ := store.Claim(ctx, 10, 30*time.Second)
	fmt.Println("scheduled:", st.Scheduled, "claimed now:", len(msgs))

	// What a relay does meanwhile: Maintain every 100ms, and claims.
	for len(msgs) == 0 {
		time.Sleep(100 * time.Millisecond)
		if err := store.Maintain(ctx); err != nil {
			log.Fatal(err)
		}
		if msgs, err = store.Claim(ctx, 10, 30*time.Second); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("claimed once due:", msgs[0].EventType, msgs[0].Key)
	// Output:
	// scheduled: 1 claimed now: 0
	// claimed once due: order.reminder order-42
}
