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
// and the mark); consumers deduplicate on the AMQP message-id, which is the
// outbox id.
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
// reconnects. See ErrBrokerUnavailable and PublishError.
//
// A settle (mark or release) that fails for a reason other than a lost
// lease, such as a database session that was terminated, is retried on a
// fresh connection while the lease lasts: the broker has confirmed those
// messages, and giving up would publish them a second time after the lease.
//
// # Running it
//
// Run blocks until its context ends, then stops claiming, waits up to
// Config.ShutdownTimeout for the confirms of the batch in flight, marks what
// was confirmed and releases the rest. Several relays, in one process or
// many, can share a table: claims never overlap while leases hold. The
// relay uses its store's own connection pool and holds no transaction open
// while it publishes. After a claim that found work it claims again at
// once; after an empty one it waits 1ms, doubling up to
// Config.PollInterval. Writes made in its process wake it at once (through
// the store's Subscribe), as does Config.Wakeup (see package pgwake for
// LISTEN/NOTIFY). Up to Config.MaxInFlight batches are in flight: while
// one awaits its confirms, the next is claimed and published, and settles
// follow claim order.
//
// With a store in ordered mode (outbox.OrderedByKey), a batch is published
// in rounds: the first message of every key, then, once the broker
// confirmed them, the second of each key, and so on; a key whose message
// was not confirmed has its later messages released (Observer.Released with
// ReleasedOrder). Claims in that mode never give two relays messages of one
// key. A relay in ordered mode reconciles the store's held messages every
// second (Reconciler); one in unordered mode once, when it starts.
//
// Errors that waiting cannot fix (wrong credentials, a missing table) are
// retried too, in case someone fixes them, but logged at error level as
// permanent and reported by Relay.Health. Run returns an error only for
// what cannot change while it runs: a closed publisher, a store without a
// pool.
//
// The AMQP side is AMQPPublisher (github.com/rabbitmq/amqp091-go); any
// other broker plugs in through the Publisher interface.
package relay
