package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/inbox"
)

// Delivered is what an inbox did with one delivery.
type Delivered struct {
	Outcome inbox.Outcome
	Err     error
	// Settled is how the delivery was answered: "ack", "requeue" or
	// "reject" (nack without requeue: dead-lettered).
	Settled string
}

// Deliver hands the inbox the delivery d times times, as a broker that
// redelivers (or a relay that published twice) would, each time through
// Handle with handler h and in the inbox's own transaction, and returns
// what it did each time. d needs a MessageId; its Acknowledger is
// replaced by one that records the answer, so no broker is needed. A nil
// inbox or handler, or a negative times, is an error and nothing is
// delivered.
func Deliver(ctx context.Context, ib *inbox.Inbox, d amqp.Delivery, h inbox.Handler, times int) ([]Delivered, error) {
	switch {
	case ib == nil:
		return nil, errors.New("outboxtest: Deliver needs an inbox (inbox.New), not nil")
	case h == nil:
		return nil, errors.New("outboxtest: Deliver needs a handler, not nil")
	case times < 0:
		return nil, fmt.Errorf("outboxtest: Deliver cannot deliver %d times: give 0 or more", times)
	}
	out := make([]Delivered, 0, times)
	for i := range times {
		ack := &recorder{}
		d := d
		d.Acknowledger, d.DeliveryTag, d.Redelivered = ack, uint64(i+1), i > 0
		o, err := ib.Handle(ctx, &d, h)
		out = append(out, Delivered{Outcome: o, Err: err, Settled: ack.answer()})
	}
	return out, nil
}

// recorder is an amqp.Acknowledger that remembers its answer.
type recorder struct {
	mu  sync.Mutex
	ans string
}

func (r *recorder) set(a string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ans = a
	return nil
}

func (r *recorder) answer() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ans
}

func (r *recorder) Ack(uint64, bool) error { return r.set("ack") }

func (r *recorder) Nack(_ uint64, _ bool, requeue bool) error {
	if requeue {
		return r.set("requeue")
	}
	return r.set("reject")
}

func (r *recorder) Reject(_ uint64, requeue bool) error { return r.Nack(0, false, requeue) }
