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
	ID    uint
	Total int
	outbox.Recorder
}

// TableName keeps the example's table apart from your own (out of example scope).
func (Invoice) TableName() string { return "gormoutbox_example.invoices" }

// Example shows the quick start: register the plugin once, record events on
// a model, and write the model as usual. The invoice and its event are
// written in one transaction; a relay publishes the event afterwards.
func Example() {
	db, err := gorm.Open(postgres.Open(dbtest.URL()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(&gormoutbox.Plugin{
		Table:  "gormoutbox_example.outbox",
		Router: outbox.ToExchange("billing"),
	}); err != nil {
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
	db.Table("gormoutbox_example.outbox").Select("event_type, exchange, routing_key").Take(&row)
	fmt.Printf("%s -> exchange %q, routing key %q\n", row.EventType, row.Exchange, row.RoutingKey)
	// Output:
	// invoice.issued -> exchange "billing", routing key "invoice.issued"
}

// exampleSchema creates the example's tables and returns a function that
// drops them. In an application the outbox table comes from a migration.
func exampleSchema(db *gorm.DB) func() {
	db.Exec(`DROP SCHEMA IF EXISTS gormoutbox_example CASCADE`)
	db.Exec(`CREATE SCHEMA gormoutbox_example`)
	ddl, err := outbox.Schema("gormoutbox_example.outbox")
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
		db.Exec(`DROP SCHEMA gormoutbox_example CASCADE`)
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	}
}
