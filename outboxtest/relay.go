package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// Published is a message as the relay would have sent it to RabbitMQ.
type Published struct {
	Exchange, RoutingKey string
	amqp.Publishing      // every property relay.AMQPPublisher sets
}

// Publisher is an in-memory relay.Publisher that records what it is
// given, with the AMQP properties the real publisher would set. Fail, when
// set, decides a message's fate: its error is the publish's (an error for
// which errors.Is(err, relay.ErrBrokerUnavailable) holds is the broker's,
// any other the message's). It is safe for concurrent use.
type Publisher struct {
	Fail func(m *outbox.Message) error

	mu   sync.Mutex
	msgs []Published
}

var _ relay.Publisher = (*Publisher)(nil)

// Publish implements relay.Publisher.
func (p *Publisher) Publish(_ context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		if p.Fail != nil {
			if errs[i] = p.Fail(m); errs[i] != nil {
				continue
			}
		}
		p.msgs = append(p.msgs, Published{Exchange: m.Exchange, RoutingKey: m.RoutingKey, Publishing: relay.Publishing(m)})
	}
	return errs
}

// Close does nothing.
func (p *Publisher) Close() error { return nil }

// Messages returns what was published so far, in order.
func (p *Publisher) Messages() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Published(nil), p.msgs...)
}

// Drain does the relay's work in the caller's goroutine until store holds
// nothing it can claim now: claims, publishes to pub (a *Publisher, or any
// relay.Publisher), marks each message published or failed (an attempt,
// parking it at the store's MaxAttempts; a failed message waits out its
// backoff, so Drain leaves it for a later call) or releases it after a
// broker fault. It returns how many messages it marked published. The
// store needs its pool (outbox.NewStore with a *sql.DB); only what was
// committed is seen. Delayed events (outbox.Event.NotBefore) that are due
// are moved into the table first, as a relay's Store.Maintain does; those
// not due stay (MakeDue makes them due without a wait).
func Drain(ctx context.Context, store *outbox.Store, pub relay.Publisher) (int, error) {
	if store == nil || pub == nil {
		return 0, errors.New("outboxtest: Drain needs a store and a publisher")
	}
	if err := store.Maintain(ctx); err != nil {
		return 0, err
	}
	published := 0
	for {
		msgs, err := store.Claim(ctx, 100, time.Minute)
		if err != nil || len(msgs) == 0 {
			return published, err
		}
		errs := pub.Publish(ctx, msgs)
		if len(errs) != len(msgs) {
			return published, fmt.Errorf("outboxtest: the publisher returned %d results for %d messages", len(errs), len(msgs))
		}
		var ok, broker []outbox.Message
		for i, err := range errs {
			switch {
			case err == nil:
				ok = append(ok, msgs[i])
			case errors.Is(err, relay.ErrBrokerUnavailable):
				broker = append(broker, msgs[i])
			default:
				if err := store.MarkFailed(ctx, msgs[i], err.Error()); err != nil {
					return published, err
				}
			}
		}
		if len(ok) > 0 {
			if err := store.MarkPublished(ctx, ok...); err != nil {
				return published, err
			}
			published += len(ok)
		}
		if len(broker) > 0 {
			// Released, they would be claimed again at once: give them
			// back and stop, as a relay would back off.
			return published, store.Release(ctx, broker...)
		}
	}
}
