package amqptest

import (
	"slices"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Consumer records the messages that arrive on a queue.
type Consumer struct {
	mu    sync.Mutex
	ids   map[string]int
	total int
	last  amqp.Delivery
	done  chan struct{}
}

// Consume starts consuming queue on a channel of conn until the test ends.
func Consume(tb testing.TB, conn *amqp.Connection, queue string) *Consumer {
	tb.Helper()
	return ConsumeFunc(tb, conn, queue, nil)
}

// ConsumeFunc is Consume that also calls fn, if not nil, for every delivery.
func ConsumeFunc(tb testing.TB, conn *amqp.Connection, queue string, fn func(amqp.Delivery)) *Consumer {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", true /* auto-ack */, false, false, false, nil)
	if err != nil {
		tb.Fatalf("amqptest: consuming %s: %v", queue, err)
	}
	c := &Consumer{ids: make(map[string]int), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for d := range deliveries {
			if fn != nil {
				fn(d)
			}
			c.mu.Lock()
			c.ids[d.MessageId]++
			c.total++
			c.last = d
			c.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		ch.Close()
		<-c.done
	})
	return c
}

// OrderLog records, for every key (the outbox.KeyHeader of a delivery),
// the message ids in the order of their first deliveries. Its Record is a
// ConsumeFunc callback.
type OrderLog struct {
	mu    sync.Mutex
	seen  map[string]bool
	byKey map[string][]string
}

// NewOrderLog returns an empty OrderLog.
func NewOrderLog() *OrderLog {
	return &OrderLog{seen: make(map[string]bool), byKey: make(map[string][]string)}
}

// Record notes d if it is the first delivery of its message id.
func (l *OrderLog) Record(d amqp.Delivery) {
	key, _ := d.Headers["x-event-key"].(string)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[d.MessageId] {
		return
	}
	l.seen[d.MessageId] = true
	l.byKey[key] = append(l.byKey[key], d.MessageId)
}

// Keys returns a copy of the ids of every key in the order of their first
// deliveries.
func (l *OrderLog) Keys() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]string, len(l.byKey))
	for k, ids := range l.byKey {
		out[k] = slices.Clone(ids)
	}
	return out
}

// Distinct returns how many different message ids arrived.
func (c *Consumer) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// Total returns how many deliveries arrived, duplicates included.
func (c *Consumer) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// IDs returns the delivery count of every message id that arrived.
func (c *Consumer) IDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.ids))
	for k, v := range c.ids {
		out[k] = v
	}
	return out
}

// Last returns the last delivery.
func (c *Consumer) Last() amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}
