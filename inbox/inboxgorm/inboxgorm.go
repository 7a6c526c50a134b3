// Package inboxgorm lets an inbox handler write with GORM in the inbox's
// transaction. With the gormoutbox plugin registered, the events the
// handler's models record go into the outbox in that same transaction:
// consume, update and publish become one atomic step.
//
//	ib.Handle(ctx, &d, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
//		db := inboxgorm.Tx(gdb.WithContext(ctx), tx)
//		return db.Create(&shipment).Error // shipment records "shipment.created"
//	})
package inboxgorm

import (
	"database/sql"

	"gorm.io/gorm"
)

// Tx returns a session of db that runs every statement in tx, the inbox's
// transaction. It keeps db's plugins (gormoutbox among them) and context.
// Do not Commit or Rollback through it: Handle does.
func Tx(db *gorm.DB, tx *sql.Tx) *gorm.DB {
	s := db.Session(&gorm.Session{NewDB: true, Context: db.Statement.Context})
	s.Statement.ConnPool = tx
	return s
}
