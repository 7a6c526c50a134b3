package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 12, item 3: the broker closes the consumer's connection twice
// mid-stream; the consumer reconnects, and with 100 duplicates mixed in,
// every message's effect is applied exactly once. The handler stops at the
// n/4th and the n/2th message until the connection is closed, so each
// close lands while a delivery is in its handler's transaction (committed,
// then not acked: the broker redelivers it, the inbox finds it out).
func TestConsumerSurvivesClosedConnectionsExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 400
	databases(t, 0, func(t *testing.T, w *world) {
		require.NoError(t, w.ch.Cancel(testConsumerTag, false)) // the Consumer below consumes instead
		name := amqptest.Name(t, "consumer")
		stops := []int64{n / 4, n / 2}
		reached, release := make(chan struct{}, len(stops)), make([]chan struct{}, len(stops))
		for i := range release {
			release[i] = make(chan struct{})
		}
		var calls atomic.Int64
		gated := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			if i := slices.Index(stops, calls.Add(1)); i >= 0 {
				reached <- struct{}{}
				<-release[i]
			}
			return w.effect(ctx, tx, d)
		}
		c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: gated, URLs: []string{amqptest.URL()},
			ConnectionName: name, Prefetch: 20, BackoffMax: 200 * time.Millisecond, Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		for i := range n {
			w.publish(t, fmt.Sprint("m-", i))
			if i%4 == 0 {
				w.publish(t, fmt.Sprint("m-", i)) // a duplicate, as a relay may send
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		for i := range stops {
			select {
			case <-reached:
			case <-time.After(time.Minute):
				t.Fatalf("the handler never reached its call %d", stops[i])
			}
			require.Equal(t, 1, amqptest.CloseNamedConnections(t, name))
			close(release[i])
			require.Eventually(t, func() bool { return c.Stats().Reconnects >= int64(i+1) }, 30*time.Second, 5*time.Millisecond,
				"the consumer noticed the close and reconnected")
		}
		// Every message was handled and the n/4 duplicates found out. A
		// redelivery of what was committed but not acked is a duplicate too, so
		// the duplicates can reach n/4 while a message is still to come: wait
		// for the handled count itself, not for the sum of both.
		require.Eventually(t, func() bool { st := c.Stats(); return st.Handled >= n && st.Duplicates >= n/4 }, time.Minute, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)

		require.EqualValues(t, n, dbtest.Count(t, w.db, w.sql(`SELECT count(DISTINCT message_id) FROM "`+w.table+`_effects"`)), "every message applied")
		require.EqualValues(t, n, w.effects(t), "and none twice")
		st := c.Stats()
		require.EqualValues(t, n, st.Handled)
		require.GreaterOrEqual(t, st.Duplicates, int64(n/4), "the duplicates, and redeliveries of what was committed but not acked")
		require.GreaterOrEqual(t, st.Reconnects, int64(2))
		t.Logf("stats %+v", st)
	})
}

// Issue 12: two consumers (two processes of one service) on one queue,
// sharing one inbox table, with duplicates spread over both: every effect
// exactly once.
func TestTwoConsumersOnOneQueueExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	databases(t, 0, func(t *testing.T, w *world) {
		require.NoError(t, w.ch.Cancel(testConsumerTag, false))
		for i := range n {
			w.publish(t, fmt.Sprint("m-", i))
			w.publish(t, fmt.Sprint("m-", i)) // every message twice: the copies often go to different consumers
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 2)
		var consumers []*inbox.Consumer
		for range 2 {
			ib, err := inbox.New(w.db, &inbox.Config{Consumer: "billing", Table: w.table, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: w.effect, URLs: []string{amqptest.URL()}, Prefetch: 10})
			require.NoError(t, err)
			consumers = append(consumers, c)
			go func() { done <- c.Run(ctx) }()
		}
		// Every one of the 2n deliveries went through Handle: n handled, n
		// found to be duplicates.
		require.Eventually(t, func() bool {
			a, b := consumers[0].Stats(), consumers[1].Stats()
			return a.Handled+b.Handled+a.Duplicates+b.Duplicates == 2*n
		}, time.Minute, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, <-done)
		require.EqualValues(t, n, w.effects(t))
		require.EqualValues(t, n, dbtest.Count(t, w.db, w.sql(`SELECT count(DISTINCT message_id) FROM "`+w.table+`_effects"`)))
		a, b := consumers[0].Stats(), consumers[1].Stats()
		require.EqualValues(t, n, a.Handled+b.Handled)
		require.EqualValues(t, n, a.Duplicates+b.Duplicates)
		require.Positive(t, a.Handled)
		require.Positive(t, b.Handled, "both consumers took part")
	})
}

// outcomes records what the consumer's Observer sees.
type outcomes struct {
	mu  sync.Mutex
	got map[inbox.Outcome]int
}

func (o *outcomes) Handled(_ context.Context, _ *amqp.Delivery, outcome inbox.Outcome, took time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if took > 0 {
		o.got[outcome]++
	}
}

func (o *outcomes) count(outcome inbox.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got[outcome]
}

// Issue 12, items 3 and 5: the consumer reports every outcome to its
// Observer, and purges old records as it runs.
func TestConsumerObserverAndPurge(t *testing.T) {
	t.Parallel()
	w := setup(t, 0)
	require.NoError(t, w.ch.Cancel(testConsumerTag, false))
	_, err := w.db.Exec(`INSERT INTO "` + w.table + `" (consumer, message_id, received_at, handled_at) VALUES ('billing', 'ancient', now() - interval '40 days', now())`)
	require.NoError(t, err)
	obs := &outcomes{got: map[inbox.Outcome]int{}}
	c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: w.effect, URLs: []string{amqptest.URL()},
		Observer: obs, PurgeAfter: 30 * 24 * time.Hour})
	require.NoError(t, err)
	w.publish(t, "a")
	w.publish(t, "a")
	w.publish(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool {
		return obs.count(inbox.Handled) == 1 && obs.count(inbox.Duplicate) == 1 && obs.count(inbox.Refused) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return c.Stats().Purged == 1 }, 10*time.Second, 10*time.Millisecond, "the 40-day-old record")
	cancel()
	require.NoError(t, <-done)
	require.Zero(t, dbtest.Count(t, w.db, `SELECT count(*) FROM "`+w.table+`" WHERE message_id = 'ancient'`))
	require.EqualValues(t, 1, dbtest.Count(t, w.db, `SELECT count(*) FROM "`+w.table+`" WHERE message_id = 'a'`), "recent records stay")
}

// A consumer with Prefetch 1 keeps the order of the queue through failed
// handlers: a requeued delivery comes back before the ones behind it, so
// effects are applied in the order of the first deliveries.
func TestPrefetchOneKeepsOrderThroughFailures(t *testing.T) {
	t.Parallel()
	const n = 10
	w := setup(t, 0)
	require.NoError(t, w.ch.Cancel(testConsumerTag, false))
	var (
		mu      sync.Mutex
		applied []string
		failed  = map[string]int{}
	)
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if (d.MessageId == "m-3" || d.MessageId == "m-6") && failed[d.MessageId] < 2 {
			failed[d.MessageId]++
			return fmt.Errorf("a passing failure of %s", d.MessageId)
		}
		applied = append(applied, d.MessageId)
		return w.effect(ctx, tx, d)
	}
	for i := range n {
		w.publish(t, fmt.Sprint("m-", i))
	}
	c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: handler, URLs: []string{amqptest.URL()}, Prefetch: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return w.effects(t) == n }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"m-3": 2, "m-6": 2}, failed)
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprint("m-", i)
	}
	require.Equal(t, want, applied)
}
