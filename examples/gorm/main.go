// Command gorm is a small orders service on GORM: every placed order records
// an "order.placed" event, written by the gormoutbox plugin in the same
// transaction as the order. Some orders are rolled back on purpose; their
// events must never be published. A relay runs in-process and a consumer
// counts what arrives.
//
//	go run ./examples/gorm
//
// It reads DATABASE_URL and AMQP_URL (local defaults), creates a schema (on
// MySQL or MariaDB, DATABASE_URL=mysql://…, a database) and an exchange of
// its own, and removes them when it is done.
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/examples/internal/demo"
	"github.com/acemq/outbox/gormoutbox"
)

// Order is the aggregate. Embedding outbox.Recorder lets it record domain
// events; it adds no column.
type Order struct {
	ID       uint `gorm:"primaryKey"`
	Customer string
	Total    int
	outbox.Recorder
}

// OrderPlaced is the event's payload.
type OrderPlaced struct {
	OrderID  uint   `json:"order_id"`
	Customer string `json:"customer"`
	Total    int    `json:"total"`
}

// AfterCreate records the event once the order has its id. The plugin
// writes events recorded here too, in the same transaction.
func (o *Order) AfterCreate(*gorm.DB) error {
	evt, err := outbox.JSON("order.placed", fmt.Sprint(o.ID), OrderPlaced{o.ID, o.Customer, o.Total})
	o.Record(evt)
	return err
}

// placeOrder is the business transaction: the order and its event commit
// together, or not at all.
func placeOrder(db *gorm.DB, customer string, total int, outOfStock bool) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Customer: customer, Total: total}).Error; err != nil {
			return err
		}
		if outOfStock {
			return demo.ErrOutOfStock // rolls back the order and its event
		}
		return nil
	})
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	slogger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	env, err := demo.Start(ctx, "gorm")
	if err != nil {
		return err
	}
	defer env.Close()

	dialector := postgres.New(postgres.Config{Conn: env.DB})
	if demo.MySQL() { // DATABASE_URL=mysql://…: GORM's MySQL dialector, the same plugin
		dialector = mysql.New(mysql.Config{Conn: env.DB})
	}
	db, err := gorm.Open(dialector, &gorm.Config{
		Logger:         logger.Default.LogMode(logger.Silent),
		NamingStrategy: schema.NamingStrategy{TablePrefix: env.Schema + "."},
	})
	if err != nil {
		return err
	}
	// The one line that adds the outbox.
	if err := db.Use(&gormoutbox.Plugin{Table: env.Schema + ".outbox", Router: outbox.ToExchange(env.Exchange)}); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}

	stop, err := env.StartRelay(ctx, slogger)
	if err != nil {
		return err
	}
	defer stop()

	return env.PlaceOrders(ctx, 100, stop, func(customer string, total int, outOfStock bool) error {
		return placeOrder(db, customer, total, outOfStock)
	})
}
