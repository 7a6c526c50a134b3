package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 21, item 3: a transaction takes at most keyLockSlots advisory locks
// however many keys it writes, so that 50,000 keys in one transaction and
// writers beside it all succeed (a lock per key ran out of shared memory
// at 15,000).
func TestOrderedManyKeysBoundedLocks(t *testing.T) {
	t.Run("rows", func(t *testing.T) { testManyKeysBoundedLocks(t, setup(t, ordered())) })
	t.Run("log", func(t *testing.T) { testManyKeysBoundedLocks(t, setupLog(t, ordered())) })
}

func testManyKeysBoundedLocks(t *testing.T, b *testBundle) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	big, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer big.Rollback() //nolint:errcheck
	evts := make([]outbox.Event, 50_000)
	for i := range evts {
		evts[i] = outbox.Event{Type: "big", Key: fmt.Sprintf("big-%d", i), Payload: []byte(`{}`)}
	}
	require.NoError(t, b.store.Add(ctx, big, evts...))
	var pid int
	require.NoError(t, big.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	locks := dbtest.Count(t, b.db, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, pid)
	assert.LessOrEqual(t, locks, int64(1024), "one lock per slot, not per key")
	assert.Positive(t, locks)

	// Writers of other keys, 2,500 at a time, while the big one is open:
	// they wait for it (their keys' slots are taken), never fail.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				errs <- err
				return
			}
			evts := make([]outbox.Event, 2_500)
			for i := range evts {
				evts[i] = outbox.Event{Type: "side", Key: fmt.Sprintf("side-%d-%d", w, i), Payload: []byte(`{}`)}
			}
			if err := b.store.Add(ctx, tx, evts...); err != nil {
				_ = tx.Rollback()
				errs <- err
				return
			}
			errs <- tx.Commit()
		}()
	}
	require.NoError(t, big.Commit())
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 60_000, b.count(t, ""))
}

// Issue 21, item 4: a key longer than KeyMaxBytes is refused by Add, before
// anything is written and without aborting the caller's transaction, in
// both modes and both layouts; a key of KeyMaxBytes random bytes works.
func TestKeyLimit(t *testing.T) {
	ctx := context.Background()
	random := func(n int) string {
		const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
		var sb strings.Builder
		for range n {
			sb.WriteByte(letters[rand.IntN(len(letters))])
		}
		return sb.String()
	}
	for name, b := range map[string]*testBundle{
		"rows/unordered": setup(t, nil),
		"rows/ordered":   setup(t, ordered()),
		"log/unordered":  setupLog(t, nil),
	} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			for _, n := range []int{3 << 10, 64 << 10} {
				tx, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				err = b.store.Add(ctx, tx, outbox.Event{Type: "ok", Key: "fine"}, outbox.Event{Type: "long", Key: random(n)})
				require.ErrorIs(t, err, outbox.ErrInvalidEvent)
				require.ErrorContains(t, err, fmt.Sprintf("the Key is %d bytes; at most %d", n, outbox.KeyMaxBytes))
				var one int
				require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "the caller's transaction is not aborted")
				require.NoError(t, tx.Commit())
			}
			assert.Zero(t, b.count(t, ""), "nothing written")
			b.addCommitted(t, outbox.Event{Type: "max", Key: random(outbox.KeyMaxBytes)})
			assert.EqualValues(t, 1, b.count(t, ""))
			msgs, err := b.store.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			assert.Len(t, msgs[0].Key, outbox.KeyMaxBytes)
		})
	}
}
