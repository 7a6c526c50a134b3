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
	assert.LessOrEqual(t, locks, int64(2*1024), "a lock per key for the first 1,024 keys, then per slot")
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

// Issue 47, item 4: a transaction that holds many keys of an ordered table
// holds them by themselves, not their slots, up to 1,024 keys: writers of
// other keys do not wait for it (with a lock per slot, one transaction
// holding 1,000 keys held 62 % of the slots and blocked 26 of 40 such
// writers), while a writer of one of its keys still does. The keys are
// taken by Add in one call (ordered store), by Add of a store that does not
// know the table is ordered, and by the trigger alone (one event per call).
func TestOrderedKeysDoNotHoldOtherKeys(t *testing.T) {
	for _, layout := range []string{"rows", "log"} {
		for _, how := range []string{"ordered store", "unordered store", "trigger"} {
			t.Run(layout+"/"+strings.ReplaceAll(how, " ", "_"), func(t *testing.T) {
				t.Parallel()
				b := setup(t, ordered())
				if layout == "log" {
					b = setupLog(t, ordered())
				}
				writer := b.store
				if how != "ordered store" {
					var err error
					writer, err = outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.table, Logger: dbtest.Logger(t)})
					require.NoError(t, err)
				}
				testKeysDoNotHoldOtherKeys(t, b, writer, how == "trigger")
			})
		}
	}
}

func testKeysDoNotHoldOtherKeys(t *testing.T, b *testBundle, writer *outbox.Store, oneByOne bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	big, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer big.Rollback() //nolint:errcheck
	const held = 1000
	evts := make([]outbox.Event, held)
	for i := range evts {
		evts[i] = outbox.Event{Type: "big", Key: fmt.Sprintf("held-%d", i)}
	}
	if oneByOne {
		for _, e := range evts {
			require.NoError(t, writer.Add(ctx, big, e))
		}
	} else {
		require.NoError(t, writer.Add(ctx, big, evts...))
	}

	// 40 writers of other keys, each in a transaction of its own, all
	// commit while the big one is open.
	errs := make(chan error, 40)
	for w := range 40 {
		go func() {
			tx, err := b.db.BeginTx(ctx, nil)
			if err == nil {
				err = writer.Add(ctx, tx, outbox.Event{Type: "other", Key: fmt.Sprintf("other-%d", w)}, outbox.Event{Type: "other", Key: fmt.Sprintf("other-%d-b", w)})
				if err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			errs <- err
		}()
	}
	for range 40 {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("a writer of another key waits for the transaction that holds 1,000 keys")
		}
	}

	// A writer of one of its keys waits for it, and goes on when it
	// commits.
	same, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var pid int
	require.NoError(t, same.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	go func() {
		err := writer.Add(ctx, same, outbox.Event{Type: "same", Key: "held-7"})
		if err == nil {
			err = same.Commit()
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, b.db, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1`, pid) > 0
	}, time.Minute, 10*time.Millisecond, "the writer of a held key waits")
	select {
	case err := <-done:
		t.Fatalf("the writer of a held key did not wait: %v", err)
	default:
	}
	require.NoError(t, big.Commit())
	require.NoError(t, <-done)
	assert.EqualValues(t, held+80+1, b.count(t, ""))
}
