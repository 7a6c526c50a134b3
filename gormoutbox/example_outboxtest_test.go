package gormoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
)

var errRollback = errors.New("rolled back: the test leaves nothing behind")

// Example_outboxtest checks, in an application's test, that creating an
// invoice through GORM records invoice.issued in the same transaction:
// package outboxtest reads the transaction's events through
// tx.Statement.ConnPool (in a test: outboxtest.RequireEvent(t, …)).
func Example_outboxtest() {
	ctx := context.Background()
	db, err := gorm.Open(postgres.Open(dbtest.ExampleURL()) /* the test database, in a schema of this run's own */, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(&gormoutbox.Plugin{Table: "outbox", Router: outbox.ToExchange("billing")}); err != nil {
		log.Fatal(err)
	}
	cleanup := exampleSchema(db) // out of example scope: creates the tables
	defer cleanup()

	err = db.Transaction(func(tx *gorm.DB) error {
		invoice := Invoice{Total: 4200}
		evt, _ := outbox.JSON("invoice.issued", "", map[string]any{"total": 4200})
		invoice.Record(evt)
		if err := tx.Create(&invoice).Error; err != nil { // the code under test
			return err
		}
		evts, err := outboxtest.Find(ctx, tx.Statement.ConnPool, "outbox", outboxtest.Match{Type: "invoice.issued", Payload: `{"total": 4200}`})
		if err != nil {
			return err
		}
		fmt.Println(len(evts), "invoice.issued in the transaction, to", evts[0].Exchange)
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		log.Fatal(err)
	}
	// Output: 1 invoice.issued in the transaction, to billing
}
