// Package outbox is a transactional outbox for PostgreSQL, MySQL and
// MariaDB (see [Database]): domain events are
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
// [Store.Parked], re-armed by [Store.Retry] or given up on by
// [Store.Discard], which keeps its row. Published rows stay until
// [Store.PurgePublished] removes them. A claim is bounded by rows and by
// bytes ([StoreConfig.BatchMaxBytes]), so that a few large rows cannot
// exhaust a relay's memory.
//
// An event with [Event.NotBefore] later than now is delayed: it commits
// with the transaction, waits beside the table (in <table>_scheduled)
// where no claim sees it, and [Store.MoveDue], which a relay calls when
// the next is due and at least every second, moves it into the table once
// it is due, as if written then. It
// is never claimed before NotBefore; operators see it ([Stats.Scheduled],
// [Store.Scheduled]) and can publish it now or discard it
// ([Store.PublishNow], [Store.DiscardScheduled]).
//
// # Ordered mode
//
// By default ([Unordered]) messages are claimed oldest first but relays
// publish them side by side, and a message that fails backs off while later
// ones go ahead. An ordered table ([OrderedByKey]) keeps the order of each key:
// for two messages m1 and m2 with the same non-empty [Event.Key], where m1
// was written first, the first delivery of m2 never comes before the first
// delivery of m1 to a queue consumed in order (one consumer, or RabbitMQ's
// single active consumer), with any number of relays and across relay
// crashes, lost leases, broker connection loss and shutdown. Messages
// without a key are not ordered.
//
// The order is a property of the table, recorded in the database: a table
// is made ordered by its order trigger ([OrderSchema], `outbox schema
// --ordered`, a Store in ordered mode's [Store.CreateSchemaIfAbsent]) and
// converted either way, online, by [Store.ConvertOrdering] (`outbox convert
// --to ordered|unordered`). Every writer of an ordered table takes each
// key's turn, whatever its [StoreConfig] says and whatever program writes
// (an unordered Store, an ORM, a raw INSERT); every relay reads the table's
// mode when it starts and every second, and claims in it
// ([Store.CheckOrdering], [Store.Ordering]). [StoreConfig.Ordering] says what
// a program expects: a relay set to [OrderedByKey] refuses an unordered
// table.
//
// "Written first" is decided by the database, not by a clock: before a row
// with a key is inserted, the trigger takes a transaction-scoped lock on
// the key (its own for a transaction's first 1,024 keys, beyond those one of
// a fixed number of slots, by the key's hash) and only then
// numbers the row ([Message.Seq], a sequence). Writers of one key take
// turns, the second waiting until the first commits or rolls back, so a
// key's order is the order in which the writers' transactions took it,
// which is their commit order. [Store.Add] takes a call's keys in the order
// of their slots first, so that one call never deadlocks with another.
//
// A claim takes a message only with every unpublished message of its key
// written before it, and the relay publishes a key's messages one after
// another, each after the broker confirmed the one before. A message that
// fails holds back the later messages of its key: they are set aside (held)
// while it backs off, and when it is parked its key is blocked until
// [Store.Retry] or [Store.Discard]; [Stats.BlockedKeys] and
// [Gauges.BlockedKeys] count such keys. [Store.Reconcile] keeps the held
// messages true; relays of an ordered table call it.
//
// # Words
//
// One vocabulary, here and in package relay, the CLI, the metrics and the
// README:
//
//   - pending: waiting to be published, whatever it waits for: ready,
//     claimed, backing off, held, parked and scheduled messages, all of
//     them ([Store.Pending], [Stats.Pending], [Gauges.Pending]), as the
//     store's contract says.
//   - scheduled (delayed): written with [Event.NotBefore] later than now;
//     waits beside the table until it is due ([Stats.Scheduled],
//     [Stats.NextDue]).
//   - ready: claimable now: neither claimed, backing off, held nor parked
//     ([Stats.Ready]). What should be moving: alert on it and on
//     [Stats.OldestReadyAge], not on pending, which counts parked ones.
//   - claimed (in flight): leased to a relay until its claim expires
//     ([Stats.InFlight]).
//   - backing off (retrying): failed, and not claimable until its backoff
//     has passed ([Stats.Retrying]).
//   - parked: failed [StoreConfig.MaxAttempts] times; waits for an
//     operator ([Store.Retry], [Store.Discard]).
//   - discarded: given up on by an operator; its row stays until purged.
//   - held (ordered mode): set aside because an earlier message of its key
//     failed (or, in the log layout, is in flight while it waits in a
//     batch of its own); it comes back when that one is published,
//     re-armed or discarded ([Stats.Held], [Store.Reconcile]). The rows
//     layout holds it in the table, the log layout in the failed table.
//   - blocked key (ordered mode): a key with a parked message; its later
//     messages are held until an operator acts ([Stats.BlockedKeys]).
//   - not sent (ordered mode, in a relay's memory): a message of a batch
//     the relay did not publish because an earlier message of its key in
//     the batch was not confirmed; it is released at once
//     (relay.ReleasedOrder), and is not held.
//
// # The table
//
// The schema is part of the contract; see [Schema] for its DDL and
// [Migrations] for the same as migration files. Table names are validated
// and quoted, and user data only ever travels as bind parameters.
//
// A table has one of two layouts ([Layout]), recorded in the database when
// it is created and read from there by every Store ([Store.Layout]): no
// configuration chooses it. [LayoutLog], the default ([Schema],
// [Store.CreateSchemaIfAbsent], [Migrations], `outbox schema`), only ever
// inserts events, records what relays did in small insert-only tables
// beside them, and empties whole partitions by TRUNCATE, so that relaying
// leaves no dead tuples behind and keeps its speed while VACUUM is held
// back; use it. [LayoutRows] ([RowsSchema], [Store.CreateRowsSchemaIfAbsent])
// keeps one row per message and updates it as the message moves on.
// [Store.ConvertToLog] turns the second into the first, online.
//
// On MySQL and MariaDB ([MySQL], told from the pool's driver or
// [StoreConfig.Database]) a table has one layout, [LayoutRows], and is
// unordered ([MySQLSchema] for its DDL, `outbox schema --database-url
// mysql://…`): a claim locks the ready rows in the order written, FOR
// UPDATE SKIP LOCKED at READ COMMITTED, and writes its lease into them in
// one short transaction; marks are fenced by the claim as on PostgreSQL. A
// relay in another process finds new events by polling: it claims at most
// every relay.Config.PollInterval while idle (100ms by default).
//
// How the log layout hands out events: each event carries the id of the
// transaction that wrote it (tx). A claim takes a window of transactions,
// those visible in snapshot hi and not in snapshot lo (the previous
// window's hi), in the order of (tx, seq), a batch at a time. Every
// committed transaction falls in exactly one window, the first whose hi
// sees it, however late it commits and whatever seq it drew: a cursor over
// seq or time would skip a transaction that drew its number before another
// and committed after it. A batch row records the window and the part of it
// taken; settles are rows too; a batch whose lease ran out is taken over
// under its next gen, and marks are fenced by the gen. A partition is
// emptied only when every event in it is visible in the horizon: the lo of
// the oldest unfinished batch, or the cursor. The looks for batches to
// take over and for failed messages due again, and the rotation, are
// [Store.Maintain]'s, which a relay calls beside its claims; a claim loop
// that never calls it has its claims make them.
//
// An ordered table of the log layout ([LogOrderSchema], or
// [Store.ConvertOrdering]) has an order trigger too: it takes the key's
// turn, then numbers every row (ord, a sequence of its own: seq is drawn
// before the trigger runs, since it chooses the partition). A window is
// taken in the order of ord, which is the commit order of a key's rows,
// not of (tx, seq), which is not: a transaction can get its id before
// another writer of its key and write after that one committed. A batch
// records the keys it holds, and while it is unfinished no other batch
// publishes a message of those keys: a claim stops before the first such
// message, or, when that is the first of its batch (a key with a backlog
// in flight), takes it all the same and sets it aside. A message is set
// aside (held) in the failed table, behind the messages of its key there,
// when its key has a message there that is neither published nor
// discarded, or when it is so held up; its batch records it as failed.
// The failed table gives out a key's messages from its first on, while
// each is due and not parked and no unfinished batch holds the key. What
// was written before the table was made ordered (without ord) is taken
// first, in the order of (tx, seq), up to the snapshot that the conversion
// recorded.
package outbox
