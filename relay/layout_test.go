package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// A table converted to the log layout while writers write and a relay
// relays it: every committed message is delivered, and the relay goes on
// on the new layout without a restart. An ordered table becomes an ordered
// log table, and every key's messages are first delivered in order across
// the conversion.
func TestConvertToLogWhileRelaying(t *testing.T) {
	if dbtest.LogLayout() {
		t.Skip("converts a table of the rows layout")
	}
	t.Parallel()
	t.Run("unordered", func(t *testing.T) { t.Parallel(); testConvertToLogWhileRelaying(t, false) })
	t.Run("ordered", func(t *testing.T) { t.Parallel(); testConvertToLogWhileRelaying(t, true) })
}

func testConvertToLogWhileRelaying(t *testing.T, ordered bool) {
	orderLog := amqptest.NewOrderLog()
	cfg := &outbox.StoreConfig{}
	if ordered {
		cfg.Ordering = outbox.OrderedByKey
	}
	b := setupFunc(t, cfg, orderLog.Record)
	r, err := relay.New(b.store, newPublisher(t, nil), &relay.Config{Logger: dbtest.Logger(t), PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = r.Run(ctx)
	}()
	defer func() { cancel(); wg.Wait() }()

	var (
		mu        sync.Mutex
		committed []string
		stop      = make(chan struct{})
		writers   sync.WaitGroup
	)
	for w := 0; w < 3; w++ {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					continue // the conversion's lock timed out a writer: nothing was written
				}
				ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "conv", Key: fmt.Sprint("k", rand.IntN(10)), Payload: []byte(`{}`)})
				if err != nil || tx.Commit() != nil {
					_ = tx.Rollback()
					continue
				}
				mu.Lock()
				committed = append(committed, ids...)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // pacing, not synchronisation
			}
		}()
	}
	written := func() int { mu.Lock(); defer mu.Unlock(); return len(committed) }
	require.Eventually(t, func() bool { return written() >= 300 && b.consumer.Distinct() >= 100 }, time.Minute, 5*time.Millisecond)

	conv, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.store.Table(), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	done, err := conv.ConvertToLog(ctx, false, 5*time.Second)
	require.NoError(t, err)
	t.Logf("converted in %s: %d pending copied", done.Took, done.Pending)
	at := written()
	require.Eventually(t, func() bool { return written() >= at+300 }, time.Minute, 5*time.Millisecond)
	close(stop)
	writers.Wait()

	mu.Lock()
	want := append([]string(nil), committed...)
	mu.Unlock()
	require.Eventually(t, func() bool {
		got := b.consumer.IDs()
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "every committed message is delivered")
	l, err := b.store.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l, "the relay's store found the new layout")
	require.Eventually(t, func() bool { n, err := conv.Pending(ctx); return err == nil && n == 0 }, time.Minute, 20*time.Millisecond)
	t.Logf("%d committed, %d deliveries", len(want), b.consumer.Total())
	if !ordered {
		return
	}
	// Each key's order: what the old table published before the
	// conversion, in seq, then the new table's messages, in ord.
	after := dbtest.IDsByKey(t, b.db, `"`+b.store.Table()+`"`)
	copied := map[string]bool{}
	for _, ids := range after {
		for _, id := range ids {
			copied[id] = true
		}
	}
	wantOrder := map[string][]string{}
	for key, ids := range dbtest.IDsByKey(t, b.db, `"`+done.OldTable+`"`) {
		for _, id := range ids {
			if !copied[id] {
				wantOrder[key] = append(wantOrder[key], id)
			}
		}
	}
	for key, ids := range after {
		wantOrder[key] = append(wantOrder[key], ids...)
	}
	got := orderLog.Keys()
	for key, ids := range wantOrder {
		require.Equal(t, ids, got[key], "key %s: first deliveries across the conversion", key)
	}
}
