package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

func ordered() *outbox.StoreConfig { return &outbox.StoreConfig{Ordering: outbox.OrderedByKey} }

func keyed(key string, n int) outbox.Event {
	return outbox.Event{Type: "thing.happened", Key: key, Payload: []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, key, n))}
}

// claimTypes claims up to n messages and returns their payloads.
func claimed(t *testing.T, s *outbox.Store, n int) ([]outbox.Message, []string) {
	t.Helper()
	msgs, err := s.Claim(context.Background(), n, time.Minute)
	require.NoError(t, err)
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.Payload))
	}
	return msgs, out
}

func p(key string, n int) string { return fmt.Sprintf(`{"key":%q,"n":%d}`, key, n) }

func TestOrderedClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	b.addCommitted(t, keyed("a", 1), keyed("b", 1), keyed("a", 2), outbox.Event{Type: "free", Payload: []byte("free")}, keyed("a", 3))

	// A claim of two takes the first two in the order of writing.
	first, got := claimed(t, b.store, 2)
	require.Equal(t, []string{p("a", 1), p("b", 1)}, got)
	require.Less(t, first[0].Seq, first[1].Seq)

	// The next claim skips a's later messages while a1 is claimed, but
	// takes what has no key.
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{"free"}, got)

	// a1 fails and backs off: a2 and a3 are held behind it; b2, written
	// now, goes.
	require.NoError(t, b.store.MarkPublished(ctx, first[1]))
	require.NoError(t, b.store.MarkFailed(ctx, first[0], "unroutable"))
	require.EqualValues(t, 2, b.count(t, "held"))
	b.addCommitted(t, keyed("b", 2), keyed("a", 4))
	b2, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("b", 2)}, got, "a's messages wait behind a1's backoff (backoff is ~1s)")
	require.NoError(t, b.store.MarkPublished(ctx, b2...))

	// a4, written after a1 failed, is held by Reconcile.
	held, unheld, err := b.store.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int64{1, 0}, [2]int64{held, unheld})
	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Held)
	require.EqualValues(t, 5, st.Pending, "a1 to a4, and the free message still claimed")
	g, err := b.store.Gauges(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, [2]int64{st.Pending, st.Held}, [2]int64{g.Pending, g.Held}, "Stats and Gauges agree (issue 18, item 3)")
	require.InDelta(t, st.OldestPendingAge.Seconds(), g.OldestPendingAge.Seconds(), 1)
	g1, err := b.store.Gauges(ctx, 1)
	require.NoError(t, err)
	require.InDelta(t, g.OldestPendingAge.Seconds(), g1.OldestPendingAge.Seconds(), 0.5, "the oldest is the oldest, whatever the counts' limit")

	// Once a1 is ready again, it goes first, alone; publishing it brings
	// back a2, a3 and a4, which go together, in order.
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET available_at = now() WHERE published_at IS NULL`)
	require.NoError(t, err)
	as, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1)}, got)
	require.Equal(t, 1, as[0].Attempts)
	require.NoError(t, b.store.MarkPublished(ctx, as...))
	require.Zero(t, b.count(t, "held"))
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 2), p("a", 3), p("a", 4)}, got)
}

// TestOrderedReconcileBringsBackStrays: messages left held with nothing
// blocking them (a bring-back that failed) come back on Reconcile.
func TestOrderedReconcileBringsBackStrays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	b.addCommitted(t, keyed("a", 1), keyed("a", 2), keyed("b", 1))
	_, err := b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET held = true WHERE event_key = 'a'`)
	require.NoError(t, err)
	_, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("b", 1)}, got)
	held, unheld, err := b.store.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 2}, [2]int64{held, unheld})
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1), p("a", 2)}, got)

	// A table back in unordered mode holds nothing: a relay's Reconcile
	// brings back what ordered mode held, however blocked its key is.
	unordered, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.table})
	require.NoError(t, err)
	b.addCommitted(t, keyed("c", 1), keyed("c", 2))
	_, err = unordered.ConvertOrdering(ctx, outbox.Unordered, false, time.Second)
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET parked_at = now(), attempts = 10 WHERE payload = $1`, []byte(p("c", 1)))
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET held = true WHERE payload = $1`, []byte(p("c", 2)))
	require.NoError(t, err)
	held, unheld, err = unordered.Reconcile(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 1}, [2]int64{held, unheld})
	_, got = claimed(t, unordered, 10)
	require.Equal(t, []string{p("c", 2)}, got)
}

func TestOrderedParkRetryDiscard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := ordered()
	cfg.MaxAttempts = 1
	b := setup(t, cfg)
	b.addCommitted(t, keyed("a", 1), keyed("a", 2), keyed("b", 1), keyed("b", 2), keyed("c", 1))

	msgs, _ := claimed(t, b.store, 10)
	require.Len(t, msgs, 5)
	// a1 and b1 are parked; the rest is released.
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "no route"))
	require.NoError(t, b.store.MarkFailed(ctx, msgs[2], "no route"))
	require.NoError(t, b.store.Release(ctx, msgs[1], msgs[3]))
	require.NoError(t, b.store.MarkPublished(ctx, msgs[4]))

	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.BlockedKeys)
	require.EqualValues(t, 2, st.Parked)
	b.addCommitted(t, keyed("a", 3), keyed("c", 2))
	_, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("c", 2)}, got, "keys a and b are blocked by their parked heads")

	// Retry unblocks a: a1, a2, a3 in order. Discard unblocks b: b2 only.
	n, err := b.store.Retry(ctx, msgs[0].ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = b.store.Discard(ctx, msgs[2].ID, msgs[4].ID) // c1 is published, not parked: ignored
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1), p("a", 2), p("b", 2), p("a", 3)}, got)

	// The discarded message is kept, with its record.
	require.EqualValues(t, 1, b.count(t, "discarded_at IS NOT NULL AND published_at IS NOT NULL AND last_error = 'no route' AND attempts = 1"))
	st, err = b.store.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.BlockedKeys)
	require.Zero(t, st.Parked)

	_, err = b.store.Discard(ctx, "not-an-id")
	require.ErrorContains(t, err, `"not-an-id" is not a message id`)
}

// TestOrderedConcurrentClaimers: claimers on two pools claim, publish,
// fail and release at random; whenever one claims a message, every
// message of its key written before it is published or in the same claim.
func TestOrderedConcurrentClaimers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const keys, perKey = 50, 40
	cfg := ordered()
	cfg.Backoff = func(int) time.Duration { return time.Millisecond }
	cfg.MaxAttempts = 1000
	b := setup(t, cfg)
	var evts []outbox.Event
	for n := range perKey {
		for k := range keys {
			evts = append(evts, keyed(fmt.Sprint(k), n))
		}
	}
	b.addCommitted(t, evts...)
	other, err := outbox.NewStore(dbtest.NewDB(t), &outbox.StoreConfig{Table: b.table, Ordering: outbox.OrderedByKey, Backoff: cfg.Backoff, MaxAttempts: 1000})
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		published = map[string]int{} // key → messages published (they go in order)
		written   = map[string]int{}
		wg        sync.WaitGroup
		errs      = make(chan error, 16)
		writing   atomic.Bool
		stop      = make(chan struct{})
	)
	for k := range keys {
		written[fmt.Sprint(k)] = perKey
	}
	// A writer goes on writing, and Reconcile runs in a loop, as a relay's
	// would, racing the holds and bring-backs of the claimers' settles.
	writing.Store(true)
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer writing.Store(false)
		for range 100 {
			k := fmt.Sprint(rand.IntN(keys))
			tx, err := b.db.BeginTx(ctx, nil)
			if err == nil {
				err = b.store.Add(ctx, tx, keyed(k, written[k]))
			}
			if err == nil {
				err = tx.Commit()
			}
			if err != nil {
				errs <- err
				return
			}
			written[k]++
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := b.store.Reconcile(ctx); err != nil {
				errs <- err
				return
			}
		}
	}()
	var claimers sync.WaitGroup
	for _, store := range []*outbox.Store{b.store, other} {
		for range 4 {
			claimers.Add(1)
			go func() {
				defer claimers.Done()
				for idle := 0; idle < 50 || writing.Load(); {
					msgs, err := store.Claim(ctx, 1+rand.IntN(30), time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if len(msgs) == 0 {
						idle++
						time.Sleep(2 * time.Millisecond)
						continue
					}
					idle = 0
					mu.Lock()
					next := map[string]int{}
					for _, m := range msgs {
						var n int
						_, _ = fmt.Sscanf(string(m.Payload[len(`{"key":"`)+len(m.Key)+len(`","n":`):]), "%d", &n)
						if _, ok := next[m.Key]; !ok {
							next[m.Key] = published[m.Key]
						}
						if n != next[m.Key] {
							mu.Unlock()
							errs <- fmt.Errorf("claimed message %d of key %s while %d of its messages are published", n, m.Key, next[m.Key])
							return
						}
						next[m.Key]++
					}
					// Publish a prefix of each key's messages, fail the next, release the rest.
					var pub, rel, fail []outbox.Message
					stopped := map[string]bool{}
					for _, m := range msgs {
						switch {
						case stopped[m.Key]:
							rel = append(rel, m)
						case rand.IntN(10) == 0:
							stopped[m.Key] = true
							fail = append(fail, m)
						default:
							pub = append(pub, m)
							published[m.Key]++ // before the mark commits: stricter
						}
					}
					mu.Unlock()
					if err := store.MarkPublished(ctx, pub...); err != nil {
						errs <- err
						return
					}
					for _, m := range fail {
						if err := store.MarkFailed(ctx, m, "random"); err != nil {
							errs <- err
							return
						}
					}
					if err := store.Release(ctx, rel...); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	claimers.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, b.count(t, "published_at IS NULL"), "everything published")
	require.Positive(t, b.count(t, "attempts > 0"), "some messages failed on the way")
	for k := range keys {
		require.Equal(t, written[fmt.Sprint(k)], published[fmt.Sprint(k)])
	}
}

// TestOrderedWritersTakeTurns shows the order concurrent writers of one
// key get: the order in which they take the key, which Add holds until
// the transaction ends. The transaction that began first but wrote second
// waits for the other to commit, and its message comes after.
func TestOrderedWritersTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	begin := func() *sql.Tx {
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		return tx
	}
	early, late := begin(), begin()
	var pid int
	require.NoError(t, early.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))

	require.NoError(t, b.store.Add(ctx, late, keyed("order-1", 1)))
	done := make(chan error, 1)
	go func() { done <- b.store.Add(ctx, early, keyed("order-1", 2)) }()
	dbtest.AwaitAdvisoryWait(t, b.db, pid) // the early transaction waits for the key
	// Other keys do not wait.
	b.addCommitted(t, keyed("order-2", 1))
	require.NoError(t, late.Commit())
	require.NoError(t, <-done)
	require.NoError(t, early.Commit())

	_, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("order-1", 1), p("order-2", 1), p("order-1", 2)}, got)

	// A writer that rolls back lets the waiting one go, and leaves no gap
	// that holds the key.
	tx1, tx2 := begin(), begin()
	require.NoError(t, tx2.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	require.NoError(t, b.store.Add(ctx, tx1, keyed("order-3", 1)))
	go func() { done <- b.store.Add(ctx, tx2, keyed("order-3", 2)) }()
	dbtest.AwaitAdvisoryWait(t, b.db, pid)
	require.NoError(t, tx1.Rollback())
	require.NoError(t, <-done)
	require.NoError(t, tx2.Commit())
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("order-3", 2)}, got)
}

// TestOrderedClockSkew: two services whose clocks differ by an hour write
// events of the same keys one after the other, the second after the first
// committed. (An hour, not milliseconds: the ids' order must follow from
// the skew however slowly a loaded machine runs the two writes.) The ids (UUIDv7, from the writers' clocks) say the second came
// first; the order the database assigned, which the relay keeps, does not.
func TestOrderedClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	log := amqptest.NewOrderLog()
	amqptest.ConsumeFunc(t, conn, top.Queue, log.Record)
	cfg := ordered()
	cfg.Router = outbox.ToExchange(top.Exchange)
	b := setup(t, cfg)
	behind, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: b.table, Ordering: outbox.OrderedByKey, Router: cfg.Router})
	require.NoError(t, err)
	outbox.SetClock(behind, func() time.Time { return time.Now().Add(-time.Hour) })

	const keys = 20
	for k := range keys {
		b.addCommitted(t, keyed(fmt.Sprint("order-", k), 1))
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, behind.Add(ctx, tx, keyed(fmt.Sprint("order-", k), 2)))
		require.NoError(t, tx.Commit())
	}
	want := dbtest.IDsByKey(t, b.db, `"`+b.table+`"`)
	for key, ids := range want {
		require.Len(t, ids, 2)
		require.Less(t, ids[1], ids[0], "key %s: the second writer's id is older, by its clock", key)
	}

	r, err := relay.New(b.store, newPublisher(t), &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool { return b.count(t, "published_at IS NULL") == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		n := 0
		for _, ids := range log.Keys() {
			n += len(ids)
		}
		return n == 2*keys
	}, 10*time.Second, 10*time.Millisecond)
	got := log.Keys()
	for key, ids := range want {
		require.Equal(t, ids, got[key], "key %s: delivered in the order of writing", key)
	}
}

func newPublisher(t *testing.T) *relay.AMQPPublisher {
	t.Helper()
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqptest.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// TestOrderedKeysOfAnyText: keys that mean something in an array literal
// (quotes, backslashes, commas, braces, NULL) are locked as the text they
// are: a second writer of `a"b` waits, one of `a` does not.
func TestOrderedKeysOfAnyText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	odd := []string{`a"b`, `c\d`, `{x,y}`, `NULL`, ` spaced `, `ünï`}
	var evts []outbox.Event
	for _, k := range odd {
		evts = append(evts, keyed(k, 1))
	}
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, b.store.Add(ctx, tx, evts...))

	other, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var pid int
	require.NoError(t, other.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	require.NoError(t, b.store.Add(ctx, other, keyed("a", 1)), "another key does not wait")
	done := make(chan error, 1)
	go func() { done <- b.store.Add(ctx, other, keyed(`a"b`, 2)) }()
	dbtest.AwaitAdvisoryWait(t, b.db, pid) // the same key waits for the first writer
	require.NoError(t, tx.Commit())
	require.NoError(t, <-done)
	require.NoError(t, other.Commit())
	_, got := claimed(t, b.store, 10)
	require.Len(t, got, len(odd)+2, "the odd keys, a, and the second a\"b")
	require.Less(t, slices.Index(got, p(`a"b`, 1)), slices.Index(got, p(`a"b`, 2)), "the second writer of a\"b comes second")
}

// TestOrderedClaimIsBoundedByBytes: the byte bound cuts a key's messages
// after the first ones, never before: a claim takes a prefix of each key.
func TestOrderedClaimIsBoundedByBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := ordered()
	cfg.BatchMaxBytes = 1500
	b := setup(t, cfg)
	big := func(key string, n int) outbox.Event {
		e := keyed(key, n)
		e.Payload = append(e.Payload, make([]byte, 1000)...)
		return e
	}
	b.addCommitted(t, big("a", 1), big("a", 2), big("a", 3), big("b", 1))
	first, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1) + string(make([]byte, 1000)), p("a", 2) + string(make([]byte, 1000))}, got,
		"a1, and a2 which starts under the bound")
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("b", 1) + string(make([]byte, 1000))}, got, "a3 waits for a1 and a2; b1 does not")
	require.NoError(t, b.store.MarkPublished(ctx, first...))
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 3) + string(make([]byte, 1000))}, got)
}

// TestCheckOrdering: an ordered table of the current version keeps order;
// one whose sequence caches numbers, or of the first version, cannot, and
// says why.
func TestCheckOrdering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	require.NoError(t, b.store.CheckOrdering(ctx))
	_, err := b.db.ExecContext(ctx, `ALTER SEQUENCE "`+b.table+`_seq" CACHE 20`)
	require.NoError(t, err)
	err = b.store.CheckOrdering(ctx)
	require.ErrorIs(t, err, outbox.ErrOrderingUnsafe)
	require.ErrorContains(t, err, "caches 20 numbers per session")

	db, table := tableV1(t)
	old, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	err = old.CheckOrdering(ctx)
	require.ErrorIs(t, err, outbox.ErrOrderingUnsafe)
	require.ErrorContains(t, err, "is not an ordered table")
	_, err = old.ConvertOrdering(ctx, outbox.OrderedByKey, true, time.Second)
	require.ErrorIs(t, err, outbox.ErrOrderingUnsafe)
	require.ErrorContains(t, err, "apply migration 000002")

	// A relay in ordered mode will not run on it.
	r, err := relay.New(old, newPublisher(t), &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.ErrorIs(t, r.Run(ctx), outbox.ErrOrderingUnsafe)
}
