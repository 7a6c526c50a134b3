package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type testBundle struct {
	db    *sql.DB
	table string
	store *outbox.Store
}

// setup gives the test its own outbox table on the shared pool.
func setup(t *testing.T, cfg *outbox.StoreConfig) *testBundle {
	t.Helper()
	return setupWith(t, cfg, (*outbox.Store).CreateRowsSchemaIfAbsent)
}

// setupWith is setup that creates the table with create.
func setupWith(t *testing.T, cfg *outbox.StoreConfig, create func(*outbox.Store, context.Context) error) *testBundle {
	t.Helper()
	db := dbtest.DB(t)
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Logger = dbtest.Logger(t)
	cfg.Table = dbtest.Table(t)
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	require.NoError(t, create(store, context.Background()))
	return &testBundle{db: db, table: cfg.Table, store: store}
}

func (b *testBundle) count(t *testing.T, where string) int64 {
	t.Helper()
	q := `SELECT count(*) FROM "` + b.table + `"`
	if where != "" {
		q += " WHERE " + where
	}
	return dbtest.Count(t, b.db, q)
}

// addCommitted writes events in a transaction of their own and commits it.
func (b *testBundle) addCommitted(t *testing.T, evts ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, b.store.Add(ctx, tx, evts...))
	require.NoError(t, tx.Commit())
}

func events(n int) []outbox.Event {
	evts := make([]outbox.Event, n)
	for i := range evts {
		evts[i] = outbox.Event{Type: "thing.happened", Key: fmt.Sprint(i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	return evts
}

func ids(msgs []outbox.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// countingExecer counts the statements that go through it.
type countingExecer struct {
	*sql.Tx
	calls int
}

func (c *countingExecer) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	c.calls++
	return c.Tx.ExecContext(ctx, q, args...)
}

func TestAdd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RollbackLeavesNothingCommitKeepsAll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)

		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, b.store.Add(ctx, tx, events(3)...))
		require.Zero(t, b.count(t, ""), "rows must be invisible to other connections before commit")
		require.NoError(t, tx.Rollback())
		require.Zero(t, b.count(t, ""))

		tx, err = b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, b.store.Add(ctx, tx, events(3)...))
		require.NoError(t, tx.Commit())
		require.EqualValues(t, 3, b.count(t, ""))
	})

	t.Run("NeverUsesTheStorePool", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		own := dbtest.NewDB(t)
		store, err := outbox.NewStore(own, &outbox.StoreConfig{Table: b.table})
		require.NoError(t, err)
		require.NoError(t, own.Close())

		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, store.Add(ctx, tx, events(2)...))
		require.NoError(t, tx.Commit())
		require.EqualValues(t, 2, b.count(t, ""))

		_, err = store.Claim(ctx, 10, time.Minute)
		require.ErrorContains(t, err, "sql: database is closed", "the relay side does use the store's pool")
	})

	t.Run("WorksWithoutAPool", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		store, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: b.table})
		require.NoError(t, err)
		b.store = store
		b.addCommitted(t, events(1)...)
		require.EqualValues(t, 1, b.count(t, ""))
		_, err = store.Pending(ctx)
		require.ErrorIs(t, err, outbox.ErrNoPool)
	})

	t.Run("OneStatementPerCall", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck

		ex := &countingExecer{Tx: tx}
		require.NoError(t, b.store.Add(ctx, ex, events(10)...))
		require.Equal(t, 2, ex.calls, "the first Add of several keys asks whether the table is ordered")
		ex.calls = 0
		require.NoError(t, b.store.Add(ctx, ex, events(10)...))
		require.Equal(t, 1, ex.calls, "10 events must be one INSERT once the store knows the table is unordered")

		ex.calls = 0
		require.NoError(t, b.store.Add(ctx, ex, events(250)...))
		require.Equal(t, 5, ex.calls, "250 events are chunked into INSERTs of at most 100 rows, inside a savepoint")
		require.NoError(t, tx.Commit())
		require.EqualValues(t, 270, b.count(t, ""))
	})

	t.Run("RefusesAPoolAsTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		err := b.store.Add(ctx, b.db, events(1)...)
		require.ErrorIs(t, err, outbox.ErrNoTransaction)
		require.ErrorIs(t, b.store.Add(ctx, nil, events(1)...), outbox.ErrNoTransaction)
		require.Zero(t, b.count(t, ""))
	})

	t.Run("InvalidEventWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		err = b.store.Add(ctx, tx, outbox.Event{Type: "ok"}, outbox.Event{Payload: []byte("no type")})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		require.ErrorContains(t, err, "Type is empty")
		// The bad event comes after the first INSERT's worth of good ones.
		err = b.store.Add(ctx, tx, append(events(150), outbox.Event{Payload: []byte("no type")})...)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		require.NoError(t, tx.Commit())
		require.Zero(t, b.count(t, ""), "a bad event in a call writes none of the call's events")

		for _, bad := range []outbox.Event{
			{Type: "x", RoutingKey: strings.Repeat("k", 256)},
			{Type: "x", Exchange: strings.Repeat("e", 256)},
			{Type: strings.Repeat("t", 256)},
			{Type: "x", ContentType: strings.Repeat("c", 256)},
			{Type: "x", Headers: map[string]string{strings.Repeat("h", 256): "v"}},
		} {
			tx, err := b.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			err = b.store.Add(ctx, tx, bad)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			require.ErrorContains(t, err, "AMQP allows at most 255")
			require.NoError(t, tx.Rollback())
		}
	})

	t.Run("RoutingAndHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &outbox.StoreConfig{
			Router: outbox.ToExchange("billing"),
			Headers: func(ctx context.Context) map[string]string {
				return map[string]string{"traceparent": "00-abc-def-01", "tenant": "base"}
			},
		})
		b.addCommitted(t,
			outbox.Event{Type: "invoice.sent", Key: "inv-1", Payload: []byte("{}"), Headers: map[string]string{"tenant": "acme"}},
			outbox.Event{Type: "invoice.paid", Exchange: "payments", RoutingKey: "paid.eu", ContentType: "text/plain"},
		)
		msgs, err := b.store.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 2)

		require.Equal(t, "invoice.sent", msgs[0].EventType)
		require.Equal(t, "inv-1", msgs[0].Key)
		require.Equal(t, "billing", msgs[0].Exchange)
		require.Equal(t, "invoice.sent", msgs[0].RoutingKey)
		require.Equal(t, outbox.ContentTypeDefault, msgs[0].ContentType)
		require.Equal(t, map[string]string{"traceparent": "00-abc-def-01", "tenant": "acme"}, msgs[0].Headers)
		require.Equal(t, []byte("{}"), msgs[0].Payload)
		require.Len(t, msgs[0].ID, 36)
		require.Equal(t, byte('7'), msgs[0].ID[14], "ids are UUIDv7")

		require.Equal(t, "payments", msgs[1].Exchange)
		require.Equal(t, "paid.eu", msgs[1].RoutingKey)
		require.Equal(t, "text/plain", msgs[1].ContentType)
		require.Equal(t, []byte{}, msgs[1].Payload)
	})
}

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ConcurrentClaimersTakeEachRowOnce", func(t *testing.T) {
		t.Parallel()
		const rows = 5000
		b := setup(t, nil)
		b.addCommitted(t, events(rows)...)
		other, err := outbox.NewStore(dbtest.NewDB(t), &outbox.StoreConfig{Table: b.table})
		require.NoError(t, err)

		var (
			mu      sync.Mutex
			claimed = make(map[string]int, rows)
			wg      sync.WaitGroup
			errs    = make(chan error, 16)
		)
		for _, store := range []*outbox.Store{b.store, other} {
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						msgs, err := store.Claim(ctx, 37, time.Minute)
						if err != nil {
							errs <- err
							return
						}
						if len(msgs) == 0 {
							return
						}
						if !sort.SliceIsSorted(msgs, func(i, j int) bool { return msgs[i].Seq < msgs[j].Seq }) {
							errs <- fmt.Errorf("batch not oldest first: %v", ids(msgs))
							return
						}
						mu.Lock()
						for _, m := range msgs {
							claimed[m.ID]++
						}
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Len(t, claimed, rows, "every row claimed")
		for id, n := range claimed {
			require.Equal(t, 1, n, "row %s claimed %d times while its lease held", id, n)
		}
		require.EqualValues(t, rows, b.count(t, "claimed_until > now() AND claim_token IS NOT NULL"))
	})

	t.Run("OldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		var want []string
		for i := range 6 {
			b.addCommitted(t, outbox.Event{Type: fmt.Sprintf("e%d", i)})
		}
		rows, err := b.db.QueryContext(ctx, `SELECT event_type FROM "`+b.table+`" ORDER BY created_at, id`)
		require.NoError(t, err)
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			want = append(want, s)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{"e0", "e1", "e2", "e3", "e4", "e5"}, want)

		var got []string
		for _, n := range []int{2, 10} {
			msgs, err := b.store.Claim(ctx, n, time.Minute)
			require.NoError(t, err)
			for _, m := range msgs {
				got = append(got, m.EventType)
			}
		}
		require.Equal(t, want, got)
	})

	t.Run("LeaseByDatabaseClock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.addCommitted(t, events(1)...)
		msgs, err := b.store.Claim(ctx, 1, 90*time.Second)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		var dbNow time.Time
		require.NoError(t, b.db.QueryRowContext(ctx, "SELECT now()").Scan(&dbNow))
		require.WithinDuration(t, dbNow.Add(90*time.Second), msgs[0].ClaimedUntil, 5*time.Second)

		again, err := b.store.Claim(ctx, 1, time.Minute)
		require.NoError(t, err)
		require.Empty(t, again, "a held lease is not claimed again")
	})

	t.Run("BadArguments", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		_, err := b.store.Claim(ctx, 0, time.Minute)
		require.ErrorContains(t, err, "batch size must be at least 1")
		_, err = b.store.Claim(ctx, 1, 0)
		require.ErrorContains(t, err, "lease must be at least 1ms")
		err = b.store.MarkPublished(ctx, outbox.Message{ID: "0190e0a4-0000-7000-8000-000000000000"})
		require.ErrorContains(t, err, "not returned by Claim")
	})
}

func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	b.addCommitted(t, events(3)...)
	second, err := outbox.NewStore(dbtest.NewDB(t), &outbox.StoreConfig{Table: b.table})
	require.NoError(t, err)

	first, err := b.store.Claim(ctx, 10, 50*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, first, 3)

	var taken []outbox.Message
	require.Eventually(t, func() bool {
		taken, err = second.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		return len(taken) == 3
	}, 10*time.Second, 10*time.Millisecond, "an expired claim must be claimable again")
	require.Equal(t, ids(first), ids(taken))

	// The first claimer's lease is gone: none of its marks may land.
	err = b.store.MarkPublished(ctx, first...)
	var lost *outbox.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.ElementsMatch(t, ids(first), lost.IDs)
	require.Zero(t, b.count(t, "published_at IS NOT NULL"))

	err = b.store.MarkFailed(ctx, first[0], "too late")
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.Zero(t, b.count(t, "attempts > 0 OR last_error IS NOT NULL"))

	err = b.store.Release(ctx, first[1:]...)
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	require.EqualValues(t, 3, b.count(t, "claimed_until > now()"), "the second claim still holds")

	// The current holder settles normally, and only then is the row done.
	require.NoError(t, second.MarkPublished(ctx, taken...))
	require.EqualValues(t, 3, b.count(t, "published_at IS NOT NULL AND claim_token IS NULL"))
	err = second.MarkPublished(ctx, taken[0])
	require.ErrorIs(t, err, outbox.ErrLeaseLost, "a published row cannot be published again")
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	b.addCommitted(t, events(4)...)
	msgs, err := b.store.Claim(ctx, 4, time.Hour)
	require.NoError(t, err)
	require.NoError(t, b.store.MarkPublished(ctx, msgs[0]))
	require.NoError(t, b.store.Release(ctx, msgs[1:]...))

	again, err := b.store.Claim(ctx, 10, time.Hour)
	require.NoError(t, err)
	require.Equal(t, ids(msgs[1:]), ids(again), "released rows are claimable at once")
	for _, m := range again {
		require.Zero(t, m.Attempts, "release burns no attempt")
	}
}

func TestFailureBackoffAndParking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var backoff atomic.Int64
	b := setup(t, &outbox.StoreConfig{
		MaxAttempts: 3,
		Backoff:     func(int) time.Duration { return time.Duration(backoff.Load()) },
	})
	b.addCommitted(t, events(1)...)

	claimOne := func() []outbox.Message {
		t.Helper()
		msgs, err := b.store.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		return msgs
	}

	// Attempt 1 fails with no backoff: claimable again at once, attempt counted.
	msgs := claimOne()
	require.Len(t, msgs, 1)
	id := msgs[0].ID
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "first failure"))
	msgs = claimOne()
	require.Len(t, msgs, 1)
	require.Equal(t, 1, msgs[0].Attempts)
	require.Equal(t, "first failure", msgs[0].LastError)

	// Attempt 2 fails with an hour of backoff: not claimable, and the claim is released.
	backoff.Store(int64(time.Hour))
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "second failure"))
	require.Empty(t, claimOne(), "a row in backoff is not claimed")
	require.EqualValues(t, 1, b.count(t, "available_at > now() + interval '59 minutes' AND claim_token IS NULL AND claimed_until IS NULL AND attempts = 2 AND last_error = 'second failure'"))

	pending, err := b.store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pending, "a row in backoff is pending")

	// Time passes (the backoff is over), attempt 3 fails and parks the row.
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET available_at = now()`)
	require.NoError(t, err)
	msgs = claimOne()
	require.Len(t, msgs, 1)
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], strings.Repeat("x", 5000)))
	require.EqualValues(t, 1, b.count(t, "parked_at IS NOT NULL AND attempts = 3 AND length(last_error) < 2100"))

	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET available_at = now() - interval '1 day'`)
	require.NoError(t, err)
	require.Empty(t, claimOne(), "a parked row is never claimed")

	// Issue 38, item 1: pending means what the store's contract says,
	// parked messages included; what should be moving is ready, and
	// nothing is.
	pending, err = b.store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pending, "parked rows are pending")
	stats, err := b.store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, 1, 0}, [3]int64{stats.Pending, stats.Parked, stats.Ready})
	require.Positive(t, stats.OldestPendingAge)
	require.Zero(t, stats.OldestReadyAge)
	g, err := b.store.Gauges(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, [4]int64{1, 1, 0, 0}, [4]int64{g.Pending, g.Parked, g.Ready, int64(g.OldestReadyAge)}, "the gauges say the same")

	parked, err := b.store.Parked(ctx, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, id, parked[0].ID)
	require.Equal(t, 3, parked[0].Attempts)
	require.False(t, parked[0].ParkedAt.IsZero())

	n, err := b.store.Retry(ctx, id, "0190e0a4-0000-7000-8000-000000000000")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	msgs = claimOne()
	require.Len(t, msgs, 1, "a retried row is claimable at once")
	require.Equal(t, 0, msgs[0].Attempts)

	_, err = b.store.Retry(ctx, "x'; DROP TABLE y")
	require.ErrorContains(t, err, "is not a message id")
}

func TestRetryAllParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 1})
	b.addCommitted(t, events(3)...)
	msgs, err := b.store.Claim(ctx, 3, time.Minute)
	require.NoError(t, err)
	for _, m := range msgs[:2] {
		require.NoError(t, b.store.MarkFailed(ctx, m, "poison"))
	}
	require.EqualValues(t, 2, b.count(t, "parked_at IS NOT NULL"))
	n, err := b.store.RetryAllParked(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Zero(t, b.count(t, "parked_at IS NOT NULL"))
}

func TestPendingAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	b.addCommitted(t, events(5)...)
	msgs, err := b.store.Claim(ctx, 3, time.Minute)
	require.NoError(t, err)

	pending, err := b.store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, pending, "claimed rows are pending")

	require.NoError(t, b.store.MarkPublished(ctx, msgs[:2]...))
	pending, err = b.store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, pending)

	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 3, Ready: 2, InFlight: 1, Claimed: 1, OldestPendingAge: st.OldestPendingAge, OldestReadyAge: st.OldestReadyAge, PublishedLastHour: 2}, st)
}

func TestPurgePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &outbox.StoreConfig{PurgeBatchSize: 7})
	b.addCommitted(t, events(30)...)
	msgs, err := b.store.Claim(ctx, 20, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.MarkPublished(ctx, msgs...))
	// 15 of the published rows are old, 5 recent; 10 rows are unpublished,
	// and old too, which must not matter.
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET published_at = now() - interval '2 hours' WHERE id = ANY($1::uuid[])`, ids(msgs[:15]))
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`" SET created_at = now() - interval '3 days' WHERE published_at IS NULL`)
	require.NoError(t, err)

	var progress []int64
	n, err := b.store.PurgePublishedProgress(ctx, time.Hour, func(total int64) { progress = append(progress, total) })
	require.NoError(t, err)
	require.EqualValues(t, 15, n)
	require.Equal(t, []int64{7, 14, 15}, progress, "deleted in batches of PurgeBatchSize")
	require.EqualValues(t, 10, b.count(t, "published_at IS NULL"), "unpublished rows are never purged")
	require.EqualValues(t, 5, b.count(t, "published_at IS NOT NULL"))

	n, err = b.store.PurgePublished(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	require.EqualValues(t, 10, b.count(t, ""))

	_, err = b.store.PurgePublished(ctx, -time.Hour)
	require.ErrorContains(t, err, "must not be negative")
}

func TestTableNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		"outbox; DROP TABLE x",
		`out"box`,
		"out'box",
		"Outbox",
		"a.b.c",
		".outbox",
		"1outbox",
		"outbox ",
		strings.Repeat("x", 49),
	} {
		_, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: name})
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
		require.ErrorContains(t, err, "invalid table name", name)
		_, err = outbox.Schema(name)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
		_, err = outbox.RowsSchema(name)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
		_, err = outbox.DropSchema(name)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
	}
	_, err := outbox.Schema("")
	require.ErrorContains(t, err, "the name is empty")
	_, err = outbox.NewStore(nil, &outbox.StoreConfig{Table: strings.Repeat("x", 49)})
	require.ErrorContains(t, err, "the limit is 48")
	_, err = outbox.NewStore(nil, &outbox.StoreConfig{Table: "outbox; DROP TABLE x"})
	require.ErrorContains(t, err, "is not allowed")

	t.Run("SchemaQualified", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := dbtest.DB(t)
		table := dbtest.Schema(t) + ".outbox"
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
		require.NoError(t, err)
		require.Equal(t, table, store.Table())
		require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
		require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx), "idempotent")
		b := &testBundle{db: db, store: store}
		b.addCommitted(t, events(2)...)
		msgs, err := store.Claim(ctx, 5, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 2)
		require.EqualValues(t, 2, dbtest.Count(t, db, "SELECT count(*) FROM "+table))
		// claim_seq, key, held, parked, published: the upgrade dropped the first
		// version's claim index in the table's schema.
		require.EqualValues(t, 5, dbtest.Count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname || '.' || tablename = $1 AND indexname LIKE 'outbox\\_%\\_idx'", table))
		require.Zero(t, dbtest.Count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname || '.' || tablename = $1 AND indexname = 'outbox_claim_idx'", table))
	})
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewStore(nil, &outbox.StoreConfig{MaxAttempts: -1})
	require.ErrorContains(t, err, "StoreConfig.MaxAttempts")
	_, err = outbox.NewStore(nil, &outbox.StoreConfig{PurgeBatchSize: -1})
	require.ErrorContains(t, err, "StoreConfig.PurgeBatchSize")
	_, err = outbox.NewStore(nil, &outbox.StoreConfig{Ordering: 7})
	require.ErrorContains(t, err, "StoreConfig.Ordering must be Unordered or OrderedByKey (got 7)")
	s, err := outbox.NewStore(nil, nil)
	require.NoError(t, err)
	require.Equal(t, outbox.TableDefault, s.Table())
	require.Equal(t, outbox.MaxAttemptsDefault, s.MaxAttempts())
	require.Equal(t, outbox.Unordered, s.Ordering())
	require.Equal(t, "ordered by key", outbox.OrderedByKey.String())
}

func TestContextCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.addCommitted(t, events(2)...)
	claimed, err := b.store.Claim(context.Background(), 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tx, err := b.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck

	calls := map[string]func() error{
		"Add":                      func() error { return b.store.Add(ctx, tx, events(1)...) },
		"Claim":                    func() error { _, err := b.store.Claim(ctx, 1, time.Minute); return err },
		"MarkPublished":            func() error { return b.store.MarkPublished(ctx, claimed...) },
		"MarkFailed":               func() error { return b.store.MarkFailed(ctx, claimed[0], "x") },
		"Release":                  func() error { return b.store.Release(ctx, claimed...) },
		"Pending":                  func() error { _, err := b.store.Pending(ctx); return err },
		"Stats":                    func() error { _, err := b.store.Stats(ctx); return err },
		"Parked":                   func() error { _, err := b.store.Parked(ctx, 1); return err },
		"Retry":                    func() error { _, err := b.store.Retry(ctx, claimed[0].ID); return err },
		"RetryAllParked":           func() error { _, err := b.store.RetryAllParked(ctx); return err },
		"PurgePublished":           func() error { _, err := b.store.PurgePublished(ctx, 0); return err },
		"CreateSchemaIfAbsent":     func() error { return b.store.CreateSchemaIfAbsent(ctx) },
		"CreateRowsSchemaIfAbsent": func() error { return b.store.CreateRowsSchemaIfAbsent(ctx) },
	}
	for name, call := range calls {
		require.ErrorIs(t, call(), context.Canceled, name)
	}
	require.EqualValues(t, 1, b.count(t, "claimed_until > now()"), "nothing changed")

	// A deadline that expires while the statement waits interrupts it.
	lock, err := b.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer lock.Rollback() //nolint:errcheck
	_, err = lock.ExecContext(context.Background(), `LOCK TABLE "`+b.table+`" IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	_, err = b.store.Pending(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestExponentialBackoff(t *testing.T) {
	t.Parallel()
	const base, limit = 100 * time.Millisecond, 5 * time.Second
	backoff := outbox.ExponentialBackoff(base, limit)
	for n := 1; n <= 70; n++ {
		nominal := limit
		if n <= 6 { // 100ms·2^5 = 3.2s < 5s; 2^6 would pass the limit
			nominal = base << (n - 1)
		}
		for range 20 {
			d := backoff(n)
			require.GreaterOrEqual(t, d, nominal/2, "attempt %d", n)
			require.LessOrEqual(t, d, nominal, "attempt %d", n)
		}
	}
	require.LessOrEqual(t, backoff(0), base, "attempts below 1 count as the first")
}
