package relay_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/pgwake"
	"github.com/acemq/outbox/relay"
)

// BenchmarkEndToEnd measures throughput from committed outbox rows to a
// consumer: OUTBOX_BENCH_MESSAGES (default 50,000) small messages written
// beforehand, then timed until the last one is consumed. msgs/s is the
// figure; one relay, BatchSize 500.
func BenchmarkEndToEnd(b *testing.B) {
	n := dbtest.EnvInt(b, "OUTBOX_BENCH_MESSAGES", 50_000)
	var total int
	for range b.N {
		b.StopTimer()
		bundle := setup(b, nil)
		bundle.write(b, n, 1000, small)
		pub := newPublisher(b, nil)
		b.StartTimer()
		_, stop := start(b, bundle.store, pub, &relay.Config{BatchSize: 500})
		for bundle.consumer.Distinct() < n {
			time.Sleep(2 * time.Millisecond)
		}
		b.StopTimer()
		stop()
		total += n
		b.StartTimer()
	}
	b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkLatency measures commit-to-consume latency at a steady rate of
// OUTBOX_BENCH_RATE (default 500) single-message transactions per second for
// OUTBOX_BENCH_SECONDS (default 10), with the relay polling (its default
// 250ms PollInterval) and woken by LISTEN/NOTIFY (package pgwake).
func BenchmarkLatency(b *testing.B) {
	rate := dbtest.EnvInt(b, "OUTBOX_BENCH_RATE", 500)
	seconds := dbtest.EnvInt(b, "OUTBOX_BENCH_SECONDS", 10)
	for _, mode := range []string{"poll", "notify"} {
		b.Run("wakeup="+mode, func(b *testing.B) {
			var all []time.Duration
			for range b.N {
				all = append(all, measureLatency(b, mode, rate, seconds)...)
			}
			slices.Sort(all)
			pct := func(p float64) float64 {
				return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(pct(1), "max-ms")
			b.ReportMetric(float64(len(all)), "msgs")
		})
	}
}

func measureLatency(b *testing.B, mode string, rate, seconds int) []time.Duration {
	ctx := context.Background()
	conn := amqptest.Conn(b)
	top := amqptest.Declare(b, conn)
	table := dbtest.Table(b)
	db := dbtest.DB(b)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange(top.Exchange), Logger: dbtest.Logger(b)})
	require.NoError(b, err)
	require.NoError(b, store.CreateRowsSchemaIfAbsent(ctx))

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		latencies []time.Duration
	)
	consumer := amqptest.ConsumeFunc(b, conn, top.Queue, func(d amqp.Delivery) {
		now := time.Now()
		key, _ := d.Headers[relay.KeyHeader].(string)
		mu.Lock()
		defer mu.Unlock()
		if t, ok := committed[key]; ok {
			latencies = append(latencies, now.Sub(t))
		}
	})

	cfg := &relay.Config{BatchSize: 100}
	if mode == "notify" {
		ddl, err := outbox.NotifySchema(table)
		require.NoError(b, err)
		_, err = db.ExecContext(ctx, ddl)
		require.NoError(b, err)
		lctx, cancel := context.WithCancel(ctx)
		b.Cleanup(cancel)
		cfg.Wakeup, err = pgwake.Listen(lctx, &pgwake.Config{DatabaseURL: dbtest.URL(), Table: table, Logger: dbtest.Logger(b)})
		require.NoError(b, err)
	}
	_, stop := start(b, store, newPublisher(b, nil), cfg)

	n := rate * seconds
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		key := strconv.Itoa(i)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(b, err)
		require.NoError(b, store.Add(ctx, tx, outbox.Event{Type: "tick", Key: key}))
		// The commit time is taken before Commit returns the row to other
		// sessions' view, so a reading can only overstate the latency.
		mu.Lock()
		committed[key] = time.Now()
		mu.Unlock()
		require.NoError(b, tx.Commit())
	}
	require.Eventually(b, func() bool { return consumer.Distinct() == n }, time.Minute, 5*time.Millisecond)
	stop()
	mu.Lock()
	defer mu.Unlock()
	return latencies
}
