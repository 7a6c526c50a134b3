package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/pgerr"
	"github.com/acemq/outbox/internal/syncbuf"
	"github.com/acemq/outbox/relay"
)

// Issue 21, item 1: a relay whose store is configured unordered, started on
// an ordered table, relays in the table's mode and says so: the first
// message of a key cannot be routed, and nothing later of its key is
// published while it fails and after it is parked; every other key is
// delivered in the order of writing.
func TestUnorderedRelayOnOrderedTableKeepsTheOrder(t *testing.T) {
	t.Parallel()
	orderLog := amqptest.NewOrderLog()
	b := setupFunc(t, &outbox.StoreConfig{Ordering: outbox.OrderedByKey}, orderLog.Record, "ok.#")
	unordered, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.store.Table(), Router: outbox.ToExchange(b.top.Exchange),
		MaxAttempts: 3, Backoff: func(int) time.Duration { return 50 * time.Millisecond }, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, unordered.Ordering(), "configured unordered")

	var evts []outbox.Event
	for n := range 5 {
		for k := range 10 {
			evts = append(evts, outbox.Event{Type: "ok.event", Key: fmt.Sprint("k", k), Payload: []byte(fmt.Sprint(n))})
		}
		e := outbox.Event{Type: "ok.event", Key: "bad", Payload: []byte(fmt.Sprint(n))}
		if n == 0 {
			e.RoutingKey = "nobody.home"
		}
		evts = append(evts, e)
	}
	b.store = unordered
	b.write(t, len(evts), 7, func(i int) outbox.Event { return evts[i] })
	var logs syncbuf.Buffer
	start(t, unordered, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond, MaxInFlight: 4, BatchSize: 8, Logger: dbtest.LoggerTo(t, &logs)})

	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 50 }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, orderLog.Keys()["bad"], "nothing of the blocked key was published")
	want := dbtest.IDsByKey(t, b.db, `"`+b.store.Table()+`"`)
	got := orderLog.Keys()
	for k := range 10 {
		key := fmt.Sprint("k", k)
		require.Equal(t, want[key], got[key], "key %s: first deliveries in the order of writing", key)
	}
	require.Contains(t, logs.String(), "The table is ordered: relaying each key's messages in commit order")
	require.Contains(t, logs.String(), "ordered=true")
}

// Issue 21, item 1: a table made ordered, and then unordered again, while
// writers (unordered stores, several keys per transaction) and a relay
// (configured unordered, four batches in flight) run. Every message written
// after the conversion is first delivered in the order of its key; the
// relay says when it changed modes; nothing is lost either way.
func TestConvertOrderingWhileRelaying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	orderLog := amqptest.NewOrderLog()
	b := setupFunc(t, nil, orderLog.Record)
	var logs syncbuf.Buffer
	start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 5 * time.Millisecond, MaxInFlight: 4, BatchSize: 10, Logger: dbtest.LoggerTo(t, &logs)})

	writer, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: b.store.Table(), Router: outbox.ToExchange(b.top.Exchange)})
	require.NoError(t, err)
	var (
		stop      atomic.Bool
		written   atomic.Int64
		deadlocks atomic.Int64
		wg        sync.WaitGroup
	)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2101))
			for i := 0; !stop.Load(); i++ {
				evts := make([]outbox.Event, 1+rng.IntN(3))
				for j := range evts {
					evts[j] = outbox.Event{Type: "e", Key: fmt.Sprint("k", rng.IntN(6)), Payload: []byte(fmt.Sprintf("%d-%d-%d", w, i, j))}
				}
				tx, err := b.db.BeginTx(ctx, nil)
				if !assertNoError(t, err) {
					return
				}
				err = writer.Add(ctx, tx, evts...)
				if err == nil {
					err = tx.Commit()
				}
				if pgerr.State(err) == "40P01" {
					// Within a second of the conversion a writer that
					// read the table unordered writes several keys
					// unsorted, and may deadlock with another: documented,
					// and retried as an application would.
					_ = tx.Rollback()
					deadlocks.Add(1)
					continue
				}
				if !assertNoError(t, err) {
					_ = tx.Rollback()
					return
				}
				written.Add(int64(len(evts)))
			}
		}()
	}
	require.Eventually(t, func() bool { return written.Load() > 300 }, 30*time.Second, 5*time.Millisecond)

	conv, err := b.store.ConvertOrdering(ctx, outbox.OrderedByKey, false, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, conv.From)
	// Every row numbered after this was written through the trigger: the
	// conversion waited for the writers holding the table, and the later
	// ones waited for it. (Rows numbered while it waited were not.)
	var mark int64
	require.NoError(t, b.db.QueryRow(`SELECT last_value FROM "`+b.store.Table()+`_seq"`).Scan(&mark))
	require.Eventually(t, func() bool { return written.Load() > 1500 }, 60*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "The table was made ordered")
	}, 10*time.Second, 10*time.Millisecond, "the relay noticed")

	stop.Store(true)
	wg.Wait()
	t.Logf("%d events written, %d transactions retried after a deadlock", written.Load(), deadlocks.Load())
	require.Eventually(t, func() bool { return int64(b.consumer.Distinct()) == written.Load() }, time.Minute, 20*time.Millisecond, "nothing lost")

	// Everything written after the conversion, first delivered in the
	// order of its key.
	after := map[string][]string{}
	afterConversion, args := `SELECT event_key, id FROM "`+b.store.Table()+`" WHERE seq > $1 ORDER BY seq`, []any{mark}
	if l, err := b.store.Layout(ctx); err == nil && l == outbox.LayoutLog {
		// The trigger numbers every row it sees (ord): those are the
		// rows written after the conversion, in their keys' order.
		afterConversion, args = `SELECT event_key, id FROM "`+b.store.Table()+`" WHERE ord IS NOT NULL ORDER BY ord`, nil
	}
	rows, err := b.db.Query(afterConversion, args...)
	require.NoError(t, err)
	for rows.Next() {
		var k, id string
		require.NoError(t, rows.Scan(&k, &id))
		after[k] = append(after[k], id)
	}
	require.NoError(t, rows.Err())
	got := orderLog.Keys()
	for key, ids := range after {
		require.NotEmpty(t, ids)
		require.Equal(t, ids, subsequence(got[key], ids), "key %s: messages written after the conversion first delivered out of order", key)
	}

	// And back: the relay follows, and publishes what comes.
	_, err = b.store.ConvertOrdering(ctx, outbox.Unordered, false, 5*time.Second)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "The table was made unordered")
	}, 10*time.Second, 10*time.Millisecond)
	b.write(t, 20, 5, func(i int) outbox.Event {
		return outbox.Event{Type: "e", Key: "k1", Payload: []byte(fmt.Sprint("late-", i))}
	})
	require.Eventually(t, func() bool { return int64(b.consumer.Distinct()) == written.Load()+20 }, time.Minute, 20*time.Millisecond)
}

// subsequence returns the elements of all that are in some, in the order
// of all.
func subsequence(all, some []string) []string {
	in := map[string]bool{}
	for _, s := range some {
		in[s] = true
	}
	var out []string
	for _, s := range all {
		if in[s] {
			out = append(out, s)
		}
	}
	return out
}
