// Package gormoutbox is the GORM plugin of the transactional outbox: domain
// events recorded on your models are written into the outbox table in the
// same transaction as the models themselves, so that they are published if
// and only if that transaction commits.
//
// # Quick start
//
//	db.Use(&gormoutbox.Plugin{Router: outbox.ToExchange("orders")})
//
//	type Order struct {
//		ID    uint
//		Total int
//		outbox.Recorder // adds no column
//	}
//
//	order := Order{Total: 4200}
//	evt, _ := outbox.JSON("order.placed", "", map[string]any{"total": 4200})
//	order.Record(evt)
//	db.Create(&order) // the order row and its outbox row, one transaction
//
// A relay (package relay) publishes the outbox rows afterwards.
//
// # Which statements carry events
//
// Create (of a value, a slice or through associations), Save, Updates,
// Update and Delete of a model that embeds outbox.Recorder write the
// events recorded on it, including those recorded by the model's own
// BeforeX/AfterX hooks. Attach adds events to one statement of any model;
// Publish writes events explicitly. A statement that changes no row (an
// update that matched nothing, a create skipped by ON CONFLICT DO NOTHING)
// leaves the model's events on the model.
//
// # Transactions
//
// The plugin writes through the statement's connection, which is GORM's
// default transaction or yours (db.Transaction, db.Begin), savepoints
// included: a rolled-back nested transaction takes its events with it. With
// SkipDefaultTransaction the plugin opens a transaction around each
// statement of an event-carrying model (BeginIfNeeded), or refuses such
// statements outside a transaction with outbox.ErrNoTransaction before
// anything is written (RequireTx). Statements of other models are left
// alone and cost nothing measurable.
//
// The outbox INSERT is sent directly on the connection and does not pass
// through GORM's logger. PostgreSQL (gorm.io/driver/postgres) and MySQL or
// MariaDB (gorm.io/driver/mysql) are supported: the plugin's store speaks
// the dialector's database.
package gormoutbox
