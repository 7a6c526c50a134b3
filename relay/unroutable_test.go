package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
	"github.com/acemq/outbox/topology"
)

// unroutableWorld writes 5 events nobody subscribed to (shipment.requested)
// between 5 that have a queue (order.placed).
func unroutableWorld(t *testing.T, cfg *outbox.StoreConfig) *testBundle {
	t.Helper()
	b := setup(t, cfg, "order.placed")
	b.write(t, 10, 1, func(i int) outbox.Event {
		typ := "order.placed"
		if i%2 == 1 {
			typ = "shipment.requested"
		}
		return outbox.Event{Type: typ, Key: fmt.Sprint("order-", i/2)}
	})
	return b
}

// Issue 18, item 2: with Unroutable = drop, an event nobody subscribed to
// is counted as published, logged and counted; the others go through, and
// in ordered mode nothing blocks a key.
func TestUnroutableDrop(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.Unordered, outbox.OrderedByKey} {
		t.Run(fmt.Sprint("ordering=", ordering), func(t *testing.T) {
			t.Parallel()
			b := unroutableWorld(t, &outbox.StoreConfig{Ordering: ordering, MaxAttempts: 1})
			var log dbtest.Buffer
			pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqptest.URL(), Unroutable: relay.UnroutableDrop, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			require.NoError(t, err)
			t.Cleanup(func() { _ = pub.Close() })
			start(t, b.store, pub, &relay.Config{PollInterval: 10 * time.Millisecond})
			require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool { return b.consumer.Distinct() == 5 }, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, relay.UnroutableStats{Dropped: 5}, pub.Unroutable())
			require.Zero(t, b.count(t, "parked_at IS NOT NULL"))
			require.Equal(t, 1, strings.Count(log.String(), "Unroutable message dropped"), "one line per routing key per minute:\n%s", log.String())
			require.Contains(t, log.String(), "more_since_last_line=0")
		})
	}
}

// Issue 18, item 2: with Unroutable = alternate, an event nobody
// subscribed to is published to the alternate exchange.
func TestUnroutableAlternate(t *testing.T) {
	t.Parallel()
	b := unroutableWorld(t, nil)
	conn := amqptest.Conn(t)
	ae := amqptest.Declare(t, conn) // bound with "#": takes all
	aeConsumer := amqptest.Consume(t, conn, ae.Queue)
	pub := newPublisher(t, &relay.AMQPConfig{Unroutable: relay.UnroutableAlternate, AlternateExchange: ae.Exchange})
	start(t, b.store, pub, &relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 5 && aeConsumer.Distinct() == 5 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, relay.UnroutableStats{Diverted: 5}, pub.Unroutable())
	require.Equal(t, "shipment.requested", aeConsumer.Last().RoutingKey, "with its own routing key")
}

// Issue 18, item 2: the default parks an event nobody subscribed to, and
// its error says to declare the exchange's queue and bind it.
func TestUnroutableParkIsTheDefault(t *testing.T) {
	t.Parallel()
	b := unroutableWorld(t, &outbox.StoreConfig{MaxAttempts: 1})
	start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 5 }, 30*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 5, b.count(t, "parked_at IS NOT NULL AND last_error LIKE '%bind a queue%'"))
}

// Misconfigured choices are refused.
func TestUnroutableConfig(t *testing.T) {
	t.Parallel()
	for cfg, want := range map[*relay.AMQPConfig]string{
		{Unroutable: relay.UnroutableAlternate}: "AlternateExchange must name the exchange",
		{AlternateExchange: "x"}:                "Unroutable is not UnroutableAlternate",
		{Unroutable: 7}:                         "Unroutable(7)",
		{Topology: &topology.Topology{Queues: []topology.Queue{{Name: ""}}}}: "a queue has no name",
	} {
		_, err := relay.NewAMQPPublisher(cfg)
		require.ErrorContains(t, err, want)
	}
	u, err := relay.ParseUnroutable("drop")
	require.NoError(t, err)
	require.Equal(t, relay.UnroutableDrop, u)
	_, err = relay.ParseUnroutable("ignore")
	require.Error(t, err)
}

// Issue 18, item 1: a publisher with a Topology declares it before it
// publishes: a fresh exchange and queue, and the messages reach the queue.
func TestPublisherDeclaresTopology(t *testing.T) {
	t.Parallel()
	exchange, queue := amqptest.Name(t, "x"), amqptest.Name(t, "q")
	conn := amqptest.Conn(t)
	t.Cleanup(func() {
		ch, err := amqptest.Conn(t).Channel()
		if err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(queue+".dead", false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	})
	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t), Router: outbox.ToExchange(exchange), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, store.Add(context.Background(), tx, outbox.Event{Type: "order.placed"}, outbox.Event{Type: "order.paid"}))
	require.NoError(t, tx.Commit())

	pub := newPublisher(t, &relay.AMQPConfig{Topology: &topology.Topology{
		Exchanges: []topology.Exchange{{Name: exchange}},
		Queues:    []topology.Queue{{Name: queue, Bindings: []topology.Binding{{Exchange: exchange, Key: "order.#"}}}},
	}})
	start(t, store, pub, &relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == 2
	}, 30*time.Second, 10*time.Millisecond, "the relay declared the queue, then published")
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclarePassive(queue+".dead", true, false, false, false, nil)
	require.NoError(t, err, "its dead-letter queue was declared too")
}

// Issue 19: PublishConfirming reports a message only once the broker acked
// it and did not return it: an unroutable message is never reported as
// confirmed, whatever order the broker's frames come in.
func TestPublishConfirmingNeverReportsAReturnedMessage(t *testing.T) {
	t.Parallel()
	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn, "order.placed")
	amqptest.Consume(t, conn, top.Queue)
	pub := newPublisher(t, nil)
	var msgs []outbox.Message
	for i := range 60 {
		key := "order.placed"
		if i%7 == 3 {
			key = "nobody.listens"
		}
		msgs = append(msgs, outbox.Message{ID: uuid.NewString(), EventType: key, Exchange: top.Exchange, RoutingKey: key, Payload: []byte("{}")})
	}
	var reported []int
	errs := pub.PublishConfirming(context.Background(), msgs, func(ix []int) { reported = append(reported, ix...) })
	require.Len(t, errs, len(msgs))
	seen := map[int]bool{}
	for _, i := range reported {
		require.False(t, seen[i], "index %d reported twice", i)
		seen[i] = true
		require.NoError(t, errs[i], "message %d was reported confirmed", i)
		require.Equal(t, "order.placed", msgs[i].RoutingKey)
	}
	for i, err := range errs {
		if msgs[i].RoutingKey == "nobody.listens" {
			require.ErrorContains(t, err, "unroutable")
		} else {
			require.NoError(t, err)
			require.True(t, seen[i], "a confirmed message %d is reported", i)
		}
	}
}
