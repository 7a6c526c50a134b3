package gormoutbox_test

import (
	"fmt"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Invoice is a model that records domain events: embedding outbox.Recorder
// adds Record and PullEvents, and no column.
type Invoice struct {
	ID              uint
	Total           int
	outbox.Recorder // adds Record and PullEvents; no column
}

// Example shows the quick start: register the plugin once, record events on
// a model, and write the model as usual. The invoice and its event are
// written in one transaction; a relay publishes the event afterwards.
func Example() {
	db, err := gorm.Open(postgres.Open(dbtest.ExampleURL()) /* the test database, in a schema of this run's own */, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(&gormoutbox.Plugin{Table: "outbox", Router: outbox.ToExchange("billing")}); err != nil {
		log.Fatal(err)
	}
	cleanup := exampleSchema(db) // out of example scope: creates the tables
	defer cleanup()

	invoice := Invoice{Total: 4200}
	evt, err := outbox.JSON("invoice.issued", "", map[string]any{"total": 4200})
	if err != nil {
		log.Fatal(err)
	}
	invoice.Record(evt)
	if err := db.Create(&invoice).Error; err != nil { // the invoice row and its outbox row, one transaction
		log.Fatal(err)
	}

	var row struct{ EventType, Exchange, RoutingKey string }
	db.Table("outbox").Select("event_type, exchange, routing_key").Take(&row)
	fmt.Printf("%s -> exchange %q, routing key %q\n", row.EventType, row.Exchange, row.RoutingKey)
	// Output:
	// invoice.issued -> exchange "billing", routing key "invoice.issued"
}

// exampleSchema creates the example's tables and returns a function that
// closes the pool (dbtest drops the schema). In an application the outbox table comes from a migration.
func exampleSchema(db *gorm.DB) func() {
	ddl, err := outbox.Schema("outbox")
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Exec(ddl).Error; err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}
	return func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	}
}
