package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkAdd measures what the outbox adds to a business transaction: the
// same transaction (insert one business row, commit) without and with 1 or
// 10 events.
func BenchmarkAdd(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	store, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: dbtest.Table(b)})
	require.NoError(b, err)
	// Ordered mode, on an ordered table: the store takes the events' keys
	// first (one more statement), and the table's trigger takes each
	// row's key again (held already) and numbers the row.
	orderedPool, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b), Ordering: outbox.OrderedByKey})
	require.NoError(b, err)
	require.NoError(b, orderedPool.CreateRowsSchemaIfAbsent(ctx))
	ordered, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: orderedPool.Table(), Ordering: outbox.OrderedByKey})
	require.NoError(b, err)
	// An unordered store on the ordered table: the trigger alone for one
	// event; for several keys, the keys taken first when the table says so.
	onOrdered, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: orderedPool.Table()})
	require.NoError(b, err)
	pool, err := outbox.NewStore(db, &outbox.StoreConfig{Table: store.Table()})
	require.NoError(b, err)
	require.NoError(b, pool.CreateRowsSchemaIfAbsent(ctx))
	// The log layout (issue 20): the same INSERT, into a partitioned table
	// with two indexes and a BRIN one.
	logged, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: dbtest.Table(b)})
	require.NoError(b, err)
	logPool, err := outbox.NewStore(db, &outbox.StoreConfig{Table: logged.Table()})
	require.NoError(b, err)
	require.NoError(b, logPool.CreateLogSchemaIfAbsent(ctx))
	// An ordered table of the log layout, written by an unordered store:
	// the trigger takes the key's turn and numbers the row (ord).
	logOrdered, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: dbtest.Table(b)})
	require.NoError(b, err)
	logOrderedPool, err := outbox.NewStore(db, &outbox.StoreConfig{Table: logOrdered.Table(), Ordering: outbox.OrderedByKey})
	require.NoError(b, err)
	require.NoError(b, logOrderedPool.CreateLogSchemaIfAbsent(ctx))
	orders := dbtest.Table(b)
	_, err = db.ExecContext(ctx, `CREATE TABLE "`+orders+`" (id bigserial PRIMARY KEY, total bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(b, err)

	for _, c := range []struct {
		n     int
		store *outbox.Store
	}{{0, store}, {1, store}, {1, logged}, {10, store}, {10, logged}, {1, ordered}, {10, ordered}, {1, onOrdered}, {10, onOrdered},
		{1, logOrdered}, {10, logOrdered}} {
		name := fmt.Sprintf("events=%d", c.n)
		switch {
		case c.n == 0:
			name = "business_only"
		case c.store == ordered:
			name += "/ordered"
		case c.store == onOrdered:
			name += "/ordered_table_unordered_store"
		case c.store == logged:
			name += "/log"
		case c.store == logOrdered:
			name += "/log_ordered_table"
		}
		evts, store := events(c.n), c.store
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+orders+`" (total) VALUES ($1)`, 4200); err != nil {
					b.Fatal(err)
				}
				if err := store.Add(ctx, tx, evts...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClaimMarkPublished measures the relay's database work per batch,
// in each layout: one Claim and one MarkPublished. msgs/s is the ceiling
// the store puts on a single relay loop; allocs/op and B/op are what the
// relay's process allocates for a batch on the store's side.
func BenchmarkClaimMarkPublished(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	for _, c := range []struct {
		layout string
		batch  int
	}{{"rows", 100}, {"rows", 500}, {"log", 100}, {"log", 500}} {
		batch := c.batch
		b.Run("layout="+c.layout+"/batch="+strconv.Itoa(batch), func(b *testing.B) {
			store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b)})
			require.NoError(b, err)
			if c.layout == "log" {
				require.NoError(b, store.CreateLogSchemaIfAbsent(ctx))
			} else {
				require.NoError(b, store.CreateRowsSchemaIfAbsent(ctx))
			}
			fill := func() {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(b, err)
				require.NoError(b, store.Add(ctx, tx, events(batch*20)...))
				require.NoError(b, tx.Commit())
			}
			b.ReportAllocs()
			b.ResetTimer()
			var published int
			for range b.N {
				msgs, err := store.Claim(ctx, batch, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) < batch {
					b.StopTimer()
					if len(msgs) > 0 {
						require.NoError(b, store.Release(ctx, msgs...))
					}
					fill()
					b.StartTimer()
					if msgs, err = store.Claim(ctx, batch, time.Minute); err != nil {
						b.Fatal(err)
					}
				}
				if err := store.MarkPublished(ctx, msgs...); err != nil {
					b.Fatal(err)
				}
				published += len(msgs)
			}
			b.ReportMetric(float64(published)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkClaimWithHistory compares a claim of 100 messages on a table with
// no published rows against one holding OUTBOX_BENCH_HISTORY (default
// 1,000,000) published rows. The partial claim index should keep the two
// close.
func BenchmarkClaimWithHistory(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	history := dbtest.EnvInt(b, "OUTBOX_BENCH_HISTORY", 1_000_000)
	for _, published := range []int{0, history} {
		// Set up once, outside b.Run: the sub-benchmark runs more than once.
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b)})
		require.NoError(b, err)
		require.NoError(b, store.CreateRowsSchemaIfAbsent(ctx))
		_, err = db.ExecContext(ctx, `INSERT INTO "`+store.Table()+`" (id, event_type, payload, published_at, created_at)
			SELECT gen_random_uuid(), 'old.event', '\x7b7d', now() - interval '1 hour', now() - interval '2 hours'
			FROM generate_series(1, $1)`, published)
		require.NoError(b, err)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(b, err)
		require.NoError(b, store.Add(ctx, tx, events(1000)...))
		require.NoError(b, tx.Commit())
		_, err = db.ExecContext(ctx, `VACUUM ANALYZE "`+store.Table()+`"`)
		require.NoError(b, err)

		b.Run(fmt.Sprintf("published=%d", published), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				msgs, err := store.Claim(ctx, 100, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) != 100 {
					b.Fatalf("claimed %d, want 100", len(msgs))
				}
				b.StopTimer()
				require.NoError(b, store.Release(ctx, msgs...))
				b.StartTimer()
			}
		})
	}
}
