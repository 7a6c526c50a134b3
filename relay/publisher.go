package relay

import (
	"context"
	"time"

	"github.com/acemq/outbox"
)

// Publisher sends messages to a broker. The relay calls Publish with one
// batch at a time, never concurrently, unless the Publisher is a
// ConcurrentPublisher.
//
// Publish must return one error per message, in the order of msgs: nil when
// the broker confirmed the message (it is then marked published and never
// sent again), an error otherwise. An error for which
// errors.Is(err, ErrBrokerUnavailable) holds is the broker's fault; any other
// error is the message's. A Publisher must not report a message as
// published unless the broker has taken responsibility for it.
//
// Publish should stop waiting when ctx ends and report the messages it has no
// confirm for as broker faults.
type Publisher interface {
	Publish(ctx context.Context, msgs []outbox.Message) []error
	Close() error
}

// ConcurrentPublisher is a Publisher whose Publish may be called from
// several goroutines at once, each batch awaiting only its own confirms, as
// AMQPPublisher's may. A relay with Config.MaxInFlight > 1 then publishes
// its batches side by side; with any other Publisher it overlaps claims and
// settles with publishing, but publishes one batch at a time.
type ConcurrentPublisher interface {
	Publisher
	Concurrent() bool
}

// ConfirmingPublisher is a Publisher that tells, before Publish returns,
// which messages the broker has confirmed, so that the relay marks them
// published at once: a relay killed with a batch in flight then publishes
// again only what was confirmed in the last moments, not the whole batch.
// AMQPPublisher is one.
type ConfirmingPublisher interface {
	Publisher
	// PublishConfirming is Publish that also calls confirmed, from the
	// publishing goroutine and before it returns, with the indices (into
	// msgs) of messages whose result will be nil, as their confirms
	// arrive. Each index is reported at most once; confirmed must be quick.
	PublishConfirming(ctx context.Context, msgs []outbox.Message, confirmed func(indices []int)) []error
}

// Store is everything the relay uses of its storage; *outbox.Store is the
// implementation, on a table of either layout (outbox.LayoutRows, whose
// claims lease rows, or outbox.LayoutLog, whose claims lease windows of
// transactions in an insert-only log): the stages are the same for both.
// Every method is required, so that a type that wraps a
// store either forwards all of them (embedding a Store does) or fails to
// compile: nothing a relay relies on, ordered mode above all, can be lost
// silently by wrapping.
//
// The first four are the work: a claim is a lease on up to n messages, and
// the marks and the release are fenced by it (outbox.ErrLeaseLost when it
// has passed to another claimer). The others say how the storage behaves
// and what else it does for the relay; a storage that has nothing to do
// for one of them returns zero values.
type Store interface {
	Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error)
	MarkPublished(ctx context.Context, msgs ...outbox.Message) error
	MarkFailed(ctx context.Context, msg outbox.Message, reason string) error
	Release(ctx context.Context, msgs ...outbox.Message) error

	// Ordering says whether claims keep each key's order now (the table's
	// mode, as last read by CheckOrdering); the relay then publishes a
	// key's messages one confirm after another. It is read before and after
	// every claim.
	Ordering() outbox.Ordering

	// MaxAttempts is how many failed attempts park a message (0: not
	// known), for Observer.Failed.
	MaxAttempts() int

	// CheckOrdering reads the table's mode again, which Ordering returns
	// from then on, and returns an error wrapping outbox.ErrOrderingUnsafe
	// when the storage cannot keep the order it is asked to keep; a relay
	// calls it when it starts (and refuses to start on that error) and
	// every second while it runs.
	CheckOrdering(ctx context.Context) error

	// Reconcile sets aside (holds) the messages of blocked keys and brings
	// back the others; a relay calls it every second while the table is
	// ordered, and once when it starts or the table turns unordered.
	Reconcile(ctx context.Context) (held, unheld int64, err error)

	// Subscribe announces writes made in this process: a value on the
	// channel makes an idle relay claim at once. A nil channel: none.
	Subscribe() (wakeups <-chan struct{}, cancel func())

	// PurgePublished deletes published messages older than olderThan; the
	// relay calls it when Config.PurgeAfter is set.
	PurgePublished(ctx context.Context, olderThan time.Duration) (int64, error)

	// Maintain does the storage's upkeep beside the claims (on a log
	// table: the looks for batches to take over and for failed messages
	// due again, which the next claim takes, and the rotation of its
	// partitions), so that no claim waits for it. A relay calls it every
	// 100ms, and after a failure again after a backoff; each call does
	// only what is due.
	Maintain(ctx context.Context) error
}

var _ Store = (*outbox.Store)(nil)

// PublisherFunc adapts a function to a Publisher whose Close does nothing.
type PublisherFunc func(ctx context.Context, msgs []outbox.Message) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return f(ctx, msgs)
}

// Close does nothing.
func (f PublisherFunc) Close() error { return nil }
