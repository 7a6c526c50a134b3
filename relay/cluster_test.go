package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// Issue 13, H: the node that leads a quorum queue is killed (SIGKILL) in
// the middle of a stream. Publishes are nacked until a new leader is
// elected: the relay must release them without counting attempts, replace
// its channel, and deliver everything through the surviving nodes, parking
// nothing. In ordered mode every key's first deliveries also keep the order
// of writing. Runs only with OUTBOX_CLUSTER_TEST=1 (root, about a minute
// per mode: each starts a cluster of its own).
func TestQuorumLeaderKilled(t *testing.T) {
	for _, ordering := range []outbox.Ordering{outbox.Unordered, outbox.OrderedByKey} {
		t.Run(ordering.String(), func(t *testing.T) { quorumLeaderKilled(t, ordering) })
	}
}

func quorumLeaderKilled(t *testing.T, ordering outbox.Ordering) {
	cluster := amqptest.StartCluster(t)
	const n = 20_000
	exchange, queue := amqptest.Name(t, "x"), amqptest.Name(t, "q")
	conn, err := amqp.Dial(cluster.URLs[0])
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil))
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue, "#", exchange, false, nil))
	conn.Close()

	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t), Router: outbox.ToExchange(exchange),
		MaxAttempts: 3, Logger: dbtest.Logger(t), Ordering: ordering})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	b := &testBundle{db: db, store: store}

	leader := cluster.QueueLeader(queue)
	// The relay starts on the leader's node, so that the kill also costs
	// it its connection.
	urls := append(append([]string(nil), cluster.URLs[leader-1:]...), cluster.URLs[:leader-1]...)
	r, _ := start(t, store, newPublisher(t, &relay.AMQPConfig{URLs: urls, DialTimeout: 2 * time.Second}),
		&relay.Config{BatchSize: 100, PollInterval: 10 * time.Millisecond, BackoffMax: time.Second})

	// The writer runs beside the test goroutine, so it reports its error
	// instead of failing the test from another goroutine.
	written := make(chan error, 1)
	go func() {
		for i := 0; i < n; i += 100 {
			tx, err := db.BeginTx(context.Background(), nil)
			if err == nil {
				evts := make([]outbox.Event, 100)
				for k := range evts {
					evts[k] = small(i + k)
					evts[k].Key = fmt.Sprint("order-", (i+k)%500) // 40 messages a key
				}
				if err = store.Add(context.Background(), tx, evts...); err == nil {
					err = tx.Commit()
				}
			}
			if err != nil {
				written <- err
				return
			}
			time.Sleep(5 * time.Millisecond) // a stream, not a burst
		}
		written <- nil
	}()
	require.Eventually(t, func() bool { return r.Stats().Published >= n/4 }, time.Minute, 10*time.Millisecond)
	cluster.Kill(leader)
	t.Logf("killed c%d, the leader of the queue, after %d published", leader, r.Stats().Published)
	require.NoError(t, <-written)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 3*time.Minute, 50*time.Millisecond)
	require.EqualValues(t, 0, b.count(t, "attempts > 0 OR parked_at IS NOT NULL"), "a nack or a lost node is never the message's fault")

	survivor := cluster.URLs[leader%3]
	conn, err = amqp.Dial(survivor)
	require.NoError(t, err)
	defer conn.Close()
	log := amqptest.NewOrderLog()
	b.consumer = amqptest.ConsumeFunc(t, conn, queue, log.Record)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 50*time.Millisecond)
	if ordering == outbox.OrderedByKey {
		requireKeyOrder(t, b, log)
	}
	t.Logf("issue 13 H, %s: %d delivered, %d duplicates; relay stats %+v", ordering, b.consumer.Distinct(), b.consumer.Total()-b.consumer.Distinct(), r.Stats())
}
