// Package outbox is a transactional outbox for PostgreSQL: domain events are
// written into an outbox table in the same database transaction as the change
// they describe, and a relay publishes them to a message broker afterwards.
//
// # The promise
//
// An event is published at least once if and only if the transaction that
// wrote it committed. Nothing is lost when a relay, a database connection or
// the broker dies. A message can be delivered more than once (a relay that
// dies after the broker confirmed a message but before it was marked
// published delivers it again after its lease runs out); every message
// carries a stable id, its UUIDv7 [Message.ID], sent as the AMQP message-id,
// and consumers deduplicate on it.
//
// # Writing and relaying
//
// [Store.Add] writes events through the caller's own transaction and never
// through a connection of its own; it accepts only what proves to be a
// transaction (see [Execer]) and writes all of a call's events or none. The ORM adapters (package gormoutbox for
// GORM, entoutbox for ent) call it for you with the ORM's active
// transaction. The relay (package relay) uses the Store's other half, on the
// Store's own pool: [Store.Claim] leases a batch of ready messages,
// [Store.MarkPublished], [Store.MarkFailed] and [Store.Release] settle them,
// fenced by the claim so that a relay whose lease ran out cannot overwrite
// the work of the relay that took over.
//
// A message that fails [StoreConfig.MaxAttempts] times is parked: kept in
// the table for an operator, counted by [Store.Pending], listed by
// [Store.Parked] and re-armed by [Store.Retry]. Published rows stay until
// [Store.PurgePublished] removes them. A claim is bounded by rows and by
// bytes ([StoreConfig.BatchMaxBytes]), so that a few large rows cannot
// exhaust a relay's memory.
//
// # The table
//
// The schema is part of the contract; see [Schema] for its DDL and
// [Migrations] for the same as migration files. Table names are validated
// and quoted, and user data only ever travels as bind parameters.
package outbox
