// Package inbox is the consumer's half of the transactional outbox: it
// turns at-least-once delivery into exactly-once effects.
//
// For each delivery, Handle begins a transaction on the consumer's
// database, records the message id in an inbox table, runs the handler in
// that transaction only if the id is new, commits, and only then acks. A
// message delivered again (the broker redelivers after a lost ack, the
// outbox relay publishes twice after a crash) finds its id recorded and is
// acked without running the handler. A crash between the commit and the ack
// is therefore harmless: the redelivery is a duplicate.
//
//	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing"})
//	for d := range deliveries {
//		outcome, err := ib.Handle(ctx, &d, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET …") // the effect, in the inbox's transaction
//			return err
//		})
//		…
//	}
//
// # Failures
//
// A failure is classified where it is understood, and only the message's
// own failures count against it:
//
//   - The handler's error, or a panic in it (recovered, a *PanicError with
//     the stack), is the message's: the transaction is rolled back, the
//     attempt is counted in the database (not trusted to the broker's
//     redelivered flag) and the delivery requeued (Retried); after
//     MaxAttempts it is dead-lettered (nack without requeue, so that the
//     queue's dead-letter exchange gets it) and recorded with its error
//     (DeadLettered). A handler that knows better says so: Permanent(err)
//     dead-letters at once, Transient(err) requeues without counting.
//   - A failure of the database is not the message's: a failure to begin,
//     to record the id, to commit or to count; a terminated session or a
//     lost connection, even when the handler's own statement is what
//     reports it; a missing table. No attempt is counted and the delivery
//     is requeued (Requeued). A serialization failure or deadlock
//     (40001, 40P01) runs the transaction again at once, up to 3 times.
//     A database restart at the wrong moment therefore never costs a
//     message its effect.
//   - A message-id that cannot be recorded (missing, not valid UTF-8, a NUL
//     byte) is the message's and no redelivery changes it: it is
//     dead-lettered at once with the reason logged (Refused).
//   - A handler that commits or rolls back the inbox's transaction itself
//     is misusing it: ErrHandlerCommitted (the effect was applied with its
//     record: Handled) or ErrHandlerRolledBack (an attempt counted).
//
// Handle settles each delivery at once and never waits. Consumer backs
// off: a failed message is held for ConsumerConfig.RetryDelay, doubling
// per attempt, before it is requeued (other deliveries pass it, up to the
// prefetch), and after a failure of the database the consumer waits,
// growing from 100ms to BackoffMax, before it goes on. A failure that
// repeats is logged once per 10s with its count.
//
// # Dead letters and replay
//
// Declare the consumer's queue with a dead-letter exchange
// (x-dead-letter-exchange, and a queue bound to it): without one the broker
// drops what the inbox dead-letters. The consumer warns at start when its
// queue has none (a dead-letter exchange set by a policy is not seen).
//
// A dead-lettered message keeps its record: a copy delivered again is
// dead-lettered again, unapplied, so that a duplicate from the relay does
// not run a handler that failed. Once the cause is fixed, an operator
// lists the records (Inbox.Dead, `outbox inbox dead --consumer NAME`),
// makes them eligible again (Inbox.Retry / RetryAllDead, `outbox inbox
// retry --consumer NAME ID... | --all`) and then moves the messages back
// from the dead-letter queue (Replay, `outbox inbox replay --from QUEUE`):
// each is handled once.
//
// Inbox.Consumer runs the loop around Handle: prefetch, manual acks,
// reconnection after a connection loss, graceful shutdown, purging. This
// package uses database/sql and amqp091-go only; packages inboxgorm and
// inboxent put a GORM session or an ent client in the inbox's transaction.
//
// # Order
//
// With the outbox in ordered mode (outbox.OrderedByKey), a queue with one
// consumer (or RabbitMQ's single active consumer) receives the first
// deliveries of each key in the order the events were written, and since
// effects are applied at a message's first successful handling, they
// follow that order as long as deliveries are handled one after another and
// none is retried. A failed handler requeues its delivery: with
// ConsumerConfig.Prefetch above 1, the deliveries already sent behind it
// are handled before its retry. A consumer that must keep the order through
// failures uses Prefetch 1, so that the broker sends nothing else until
// the failed delivery comes back; a delivery dead-lettered after
// MaxAttempts lets the rest of its key go on.
package inbox
