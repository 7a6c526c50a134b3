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

// Store is the part of *outbox.Store the relay uses. It exists so that tests
// can substitute it; *outbox.Store is the implementation. The relay also
// uses, when the store has them, Ordering() outbox.Ordering (ordered mode
// publishes a key's messages one confirm after another), CheckOrdering,
// Reconciler, Subscriber, Purger and MaxAttempts: a type that wraps an
// *outbox.Store must pass them through, Ordering above all.
type Store interface {
	Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error)
	MarkPublished(ctx context.Context, msgs ...outbox.Message) error
	MarkFailed(ctx context.Context, msg outbox.Message, reason string) error
	Release(ctx context.Context, msgs ...outbox.Message) error
}

// Subscriber is implemented by stores that announce writes made in this
// process; *outbox.Store does. Run subscribes for its duration, and a value
// on the channel makes it claim at once. cancel ends the subscription.
type Subscriber interface {
	Subscribe() (wakeups <-chan struct{}, cancel func())
}

// Purger is implemented by stores that can purge published messages;
// *outbox.Store does. The relay purges only when Config.PurgeAfter is set.
type Purger interface {
	PurgePublished(ctx context.Context, olderThan time.Duration) (int64, error)
}

var _ interface {
	Store
	Purger
} = (*outbox.Store)(nil)

// PublisherFunc adapts a function to a Publisher whose Close does nothing.
type PublisherFunc func(ctx context.Context, msgs []outbox.Message) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return f(ctx, msgs)
}

// Close does nothing.
func (f PublisherFunc) Close() error { return nil }
