// Package relay moves messages from an outbox table to a message broker:
// it claims a batch (a lease, not a lock), publishes it, and marks every
// message published, failed or released, until its context ends.
//
// # Delivery
//
// A message is marked published only after the broker confirmed it
// (publisher confirms) and routed it (mandatory publishing: an unroutable
// message comes back and counts as a failure, not as a success). Messages
// without a confirm are never marked: they are released, or left to their
// lease, and published again. The result is at-least-once delivery, with
// duplicates in rare cases (a relay that dies between the broker's confirm
// and the mark, or, since the relay's bookkeeping commits without waiting
// for the disk, a database server that crashes within a second of the
// mark, or a connection lost while the broker had routed messages and not
// yet confirmed them); consumers deduplicate on the AMQP message-id, which
// is the outbox id. A publisher lane keeps at most 64 messages published
// and unconfirmed at once, whatever the batch, which bounds what one lost
// connection can cost.
//
// # Faults
//
// Each failed message is classified, so that one message never holds up
// the others. A message fault (unroutable, a missing exchange, a body over
// the broker's size limit) is the message's: it is marked failed, which
// counts an attempt and backs off, and parks the message after the store's
// MaxAttempts. When the broker closes the channel or the connection because
// of something it was sent without naming the message (FRAME_ERROR for a
// header larger than a frame, ACCESS_REFUSED for an internal or forbidden
// exchange), AMQPPublisher republishes the unconfirmed messages in halves,
// each on a fresh channel, until it finds the one the broker refuses on its
// own: that one alone is failed. A broker fault (no connection, a lost
// connection or channel, no confirm in time, a nack) is not the message's:
// it is released without an attempt, and the relay backs off and
// reconnects. While it backs off, AMQPPublisher is asked whether the broker
// answers (after 250ms, then at doubling intervals up to 2s, each a dial
// when no connection is open, claiming nothing), and the backoff ends at
// the first answer: messages written during an outage go out as soon as
// the broker is back, not when a backoff grown during the outage ends. See
// ErrBrokerUnavailable and PublishError.
//
// A settle (mark or release) that fails for a reason other than a lost
// lease, such as a database session that was terminated, is retried on a
// fresh connection while the lease lasts: the broker has confirmed those
// messages, and giving up would publish them a second time after the lease.
//
// # Running it
//
// A relay needs a store (its table and connection pool) and a publisher:
//
//	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "outbox"})
//	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: "amqp://guest:guest@localhost:5672/"})
//	r, err := relay.New(store, pub, nil) // nil: the defaults of Config
//	err = r.Run(ctx)                     // blocks; nil after a clean shutdown
//
// Run blocks until its context ends, then stops claiming, waits up to
// Config.ShutdownTimeout for the confirms of the batches in flight, marks
// what was confirmed and releases the rest. A publish that is still
// connecting to the broker (or opening its channel) then has sent nothing
// to wait for: AMQPPublisher gives that up at once, and its batch is
// released. Several relays, in one process
// or many, can share a table: claims never overlap while leases hold. The
// relay uses its store's own connection pool and holds no transaction open
// while it publishes.
//
// A Group relays several tables from one process (a schema per tenant, an
// outbox per module): a Relay for each table, added and removed while it
// runs, all on one Publisher, whose connections AMQPConfig.MaxConnections
// bounds. Each table's relay claims on its own, so a backlog on one table
// holds up no other; one table's failure is reported by Group.Health and
// leaves the others running; GroupConfig.IdleClaims bounds what the idle
// tables claim together.
//
// # The pipeline
//
// Run is three stages, each with one owner, and the storage's upkeep
// beside them:
//
//   - The claimer (one goroutine) decides when to claim, and is the only
//     one that does: it owns polling, wake-ups, backoff and Health. It
//     claims whenever fewer than Config.MaxInFlight batches are in flight,
//     not only after a full batch: at once after a claim that filled half a
//     batch or more, 3ms after a shorter one (under load, a claim then
//     gathers a few more messages instead of costing the database a round
//     trip per handful; BENCHMARKS.md has what that was measured against),
//     and after an empty claim it waits 3ms, doubling up to
//     Config.PollInterval (a relay of a large Group starts from 3ms grown
//     by the group's factor, up to a quarter of PollInterval: see
//     GroupConfig.IdleClaims), unless a
//     wake-up comes first (the store's Subscribe for writes in this
//     process, Config.Wakeup for others, see package pgwake) or a batch
//     claimed in ordered mode is settled (which may free the next messages
//     of its keys). A wake-up from this process
//     comes before the writer's commit (Add wakes as it inserts): when the
//     claim it starts finds nothing, the claimer claims again at once, by
//     when the commit has most likely landed, then every 3ms for a few
//     milliseconds, until a claim finds messages, before the waits grow
//     again. After a failed claim, or a
//     broker fault the settler reported, it backs off (jittered, from 100ms
//     to Config.BackoffMax), and no wake-up cuts that short.
//   - The publishers (Config.MaxInFlight goroutines) each publish a batch
//     (AMQPPublisher on a connection of its own) and hand the outcome on. A
//     batch is claimed only when a publisher is free to take it at once,
//     because its lease runs from the claim.
//   - The settler (one goroutine) writes the outcomes: published, failed
//     (an attempt counted) or released, one batch at a time, in the order
//     the publishes ended. With a ConfirmingPublisher (AMQPPublisher is
//     one) it also marks messages published as their confirms arrive, in
//     groups (at least 25 before the publisher waits for the next confirm,
//     and all that arrived together: a busy broker's multiple acks make one
//     group, one statement), while the rest of their batch is still being
//     published: a relay killed then publishes again only what was confirmed
//     in the last moments, not whole batches. A settler behind the
//     publishers marks the groups waiting for it, up to the next outcome,
//     in one statement a batch. One writer keeps settles from
//     contending with each other and with the claims on a small database.
//   - A goroutine beside them calls Store.Maintain every 100ms (after a
//     failure, after the relay's backoff): on a table of the log layout it
//     looks for batches to take over and for failed messages due again,
//     and rotates the partitions, so that no claim waits for that work
//     (the claimer is serial, and every message committed meanwhile would
//     wait too). The claims take what its looks found. (An idle relay of a large Group
//     waits longer between its claims, its Maintain and its moves of
//     delayed messages alike: see GroupConfig.IdleClaims.)
//   - Another goroutine moves the delayed messages that have fallen due
//     (outbox.Event.NotBefore) into the table, which wakes the claimer:
//     it calls Store.MoveDue when the next is due, at least every second
//     (another process may write one due sooner) and at most every 20ms
//     (while messages fall due without a break, each move is a short
//     statement of what fell due since the last, not a long one that
//     holds back the claims). A delayed message goes out about when it is
//     due, within a second when another process wrote it due sooner than
//     any known, and never before.
//
// A claim is bounded by a third of Config.Lease, and a shutdown does not
// cut it short: a claim cancelled mid-statement may have committed all the
// same, and its messages would wait out their lease unseen; run to its end,
// its batch is handed on and released. (A claim cut off at its bound is
// retried after a backoff; what it took, the store gives back at once when
// it can reach the database, else it is published after its lease.)
//
// A batch carries its claim time, and every deadline derives from it: its
// publish ends by the claim time plus Config.PublishTimeout (a shutdown
// cuts it to Config.ShutdownTimeout after the shutdown began, no longer:
// one goroutine of Run owns that clock); its settle may take until the end
// of its lease, and at least 5s after its publish ended, since marks and
// releases are fenced by the claim (after the lease a mark can only find
// the lease lost, or save a duplicate).
//
// Settles follow no order between batches, and need none. In unordered
// mode no order is promised. In ordered mode the store never hands out a
// message of a key while an earlier message of that key is claimed
// (outbox.Store's claim skips a key whose first unpublished message is
// claimed, backing off or parked; on a table of the log layout it stops
// before such a message, or sets it aside behind it), so while their
// leases hold two batches never hold messages of one key, and what one
// batch's settle does cannot change what another may publish. (A batch
// that outlives its lease shares its messages with the claimer that took
// them over: each publishes a key's messages one confirm after another,
// and the marks are fenced by the claim.)
//
// What a fault does at each stage: a claim that fails is the claimer's, and
// it backs off. A broker fault during a publish releases the messages
// without an attempt (ErrBrokerUnavailable); the claimer backs off before
// its next claim. A lost lease (a batch that outlived its lease) shows at
// its settle: those messages belong to another relay now, and are counted
// (Stats.LeasesLost) and left alone; they may be delivered twice, never
// lost. A settle that fails otherwise (a session terminated) is retried on
// a fresh connection until the settle's deadline; if it still fails, the
// messages are published again after their lease. A shutdown stops the
// claimer, gives the publishes in flight Config.ShutdownTimeout, then
// settles what was confirmed and releases the rest. A relay killed outright
// leaves its batches to their leases: what the broker confirmed but was not
// marked yet, and what it took but had not confirmed, is published again, a
// duplicate. A Maintain that fails is logged and tried again
// after a backoff; a second after its last call the claims make the looks
// themselves, so a failing upkeep delays no take-over.
//
// # Ordered mode
//
// On an ordered table (see outbox.OrderedByKey: the order is the table's,
// whatever the store's configuration says), a batch is published in
// rounds: the first message of every key, then, once the broker
// confirmed them, the second of each key, and so on; a key whose message
// was not confirmed has its later messages released (Observer.Released with
// ReleasedOrder). The claimer reads the table's mode when Run starts and
// every second (Store.CheckOrdering), and follows it, logging a change: a
// table converted while the relay runs is relayed in its new mode from the
// next claim (until then the store's unordered claims take no message with
// a key from an ordered table). A relay reconciles the store's held
// messages every second while the table is ordered (Store.Reconcile), and
// once when it starts or the table turns unordered. A relay whose store is
// configured OrderedByKey refuses to run on a table that is not ordered.
//
// Errors that waiting cannot fix (wrong credentials, a missing table) are
// retried too, in case someone fixes them, but logged at error level as
// permanent and reported by Relay.Health. Run returns an error only for
// misuse, which cannot change while it runs: a closed publisher, a store
// without a pool or whose *sql.DB was closed, a table that is not an outbox
// table of this version (outbox.ErrInvalidTable, from whichever of the
// store's methods says so), a table that cannot keep the order it is asked
// to keep.
//
// The AMQP side is AMQPPublisher (github.com/rabbitmq/amqp091-go); any
// other broker plugs in through the Publisher interface.
package relay
