package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// A table converted to the log layout while writers write and a relay
// relays it: every committed message is delivered, and the relay goes on
// on the new layout without a restart.
func TestConvertToLogWhileRelaying(t *testing.T) {
	if dbtest.LogLayout() {
		t.Skip("converts a table of the rows layout")
	}
	t.Parallel()
	b := setup(t, nil)
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
				ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "conv", Payload: []byte(`{}`)})
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
}
