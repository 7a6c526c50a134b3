// Package entoutbox is the ent hook of the transactional outbox: events
// produced by ent mutations are written into the outbox table through the
// mutation's own transaction, so that they are published if and only if
// that transaction commits.
//
// # Requirements
//
// The hook writes through the mutation's ExecContext, which ent generates
// only with the sql/execquery feature:
//
//	go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./ent/schema
//
// Without it, mutations that carry events fail with ErrNoExecContext before
// they write anything.
//
// # Quick start
//
//	ob, err := entoutbox.New(&entoutbox.Config{Router: outbox.ToExchange("shop")})
//	client.Use(entoutbox.Hook[*ent.Tx](ob)) // *ent.Tx: your generated transaction type
//
//	tx, _ := client.Tx(ctx)
//	_, err = tx.Order.Create().SetTotal(4200).Save(entoutbox.WithEvents(ctx, evt))
//	err = tx.Commit() // the order and its event, or neither
//
// Events come from three places: WithEvents attaches events to the next
// mutation run with a context; rules (Outbox.On) derive events from
// mutations of a schema type, with the entity's id known; Outbox.Publish
// writes events explicitly in a transaction.
//
// # Transactions
//
// A mutation that carries events outside a transaction fails with
// outbox.ErrNoTransaction before it runs: outside a transaction the
// business row would commit on its own and the event could be lost.
// Mutations without events are never touched. The events of a CreateBulk
// are written in creation order, in one INSERT.
//
// The raw ExecContext bypasses ent's session variables (entsql.WithVar).
// PostgreSQL and MySQL or MariaDB are supported: set Config.Database to
// outbox.MySQL for ent's dialect.MySQL (a mutation of the other dialect
// is refused before it runs).
package entoutbox
