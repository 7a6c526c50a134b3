package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkLogPurge measures how long PurgePublished takes to drop the
// history of a log table (OUTBOX_BENCH_PURGE_EVENTS events of 256 bytes,
// default 100,000; issue 20 asks for 10,000,000, a day at 115/s) and how
// long a writer inserting meanwhile, one event per transaction, waited at
// most: writers insert into another partition than the ones truncated.
func BenchmarkLogPurge(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	events := 100_000
	if v := os.Getenv("OUTBOX_BENCH_PURGE_EVENTS"); v != "" {
		var err error
		events, err = strconv.Atoi(v)
		require.NoError(b, err, "OUTBOX_BENCH_PURGE_EVENTS")
	}
	// Partitions of a tenth of the events each, so that the history spans
	// ten of the sixteen, as a day does with the defaults at 10M a day.
	chunk := int64(max(events/10, 1))
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b), Logger: dbtest.Logger(b)})
	require.NoError(b, err)
	ddl, err := outbox.LogSchemaSized(store.Table(), chunk, 16, 1024)
	require.NoError(b, err)
	_, err = db.ExecContext(ctx, ddl)
	require.NoError(b, err)
	table := `"` + store.Table() + `"`

	for range b.N {
		b.StopTimer()
		for done := 0; done < events; done += 1_000_000 {
			_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (id, event_type, payload)
SELECT gen_random_uuid(), 'bench', convert_to(repeat('x', 256), 'UTF8') FROM generate_series(1, $1)`, min(1_000_000, events-done))
			require.NoError(b, err)
		}
		// What autovacuum does as partitions fill over the day: the purge
		// reads their row counts from the statistics.
		_, err = db.ExecContext(ctx, `ANALYZE `+table)
		require.NoError(b, err)
		// Everything relayed: one finished batch whose window holds it all.
		_, err = db.ExecContext(ctx, `INSERT INTO "`+store.Table()+`_batch" (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until)
SELECT coalesce(max(batch_id), 0) + 1, 0, '3:3:', pg_current_snapshot(), '0', 0, '0', 0, 0, false, gen_random_uuid(), now() FROM "`+store.Table()+`_batch"`)
		require.NoError(b, err)
		// Writers move on to the next chunk, as they would over the day.
		_, err = db.ExecContext(ctx, `SELECT setval('"`+store.Table()+`_seq"', (SELECT (max(seq) / $1 + 1) * $1 FROM `+table+`))`, chunk)
		require.NoError(b, err)

		var (
			stop    = make(chan struct{})
			wg      sync.WaitGroup
			longest atomic.Int64
			writes  atomic.Int64
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Error(err)
					return
				}
				if err := store.Add(ctx, tx, outbox.Event{Type: "during", Payload: []byte(`{}`)}); err != nil {
					b.Error(err)
					return
				}
				if err := tx.Commit(); err != nil {
					b.Error(err)
					return
				}
				writes.Add(1)
				if d := time.Since(start).Nanoseconds(); d > longest.Load() {
					longest.Store(d)
				}
			}
		}()
		for writes.Load() < 50 { // the writer is up to speed
			time.Sleep(time.Millisecond)
		}
		longest.Store(0)
		b.StartTimer()
		started := time.Now()
		n, err := store.PurgePublished(ctx, 0)
		took := time.Since(started)
		b.StopTimer()
		close(stop) // the write in progress when the purge ended finishes, and counts, before the writer stops
		wg.Wait()
		require.NoError(b, err)
		require.GreaterOrEqual(b, n, int64(events)*8/10, "the purge dropped the history")
		b.ReportMetric(float64(n), "events")
		b.ReportMetric(took.Seconds()*1000, "purge-ms")
		b.ReportMetric(float64(longest.Load())/1e6, "writer-max-ms")
		b.ReportMetric(float64(writes.Load()), "writes")
		_, err = db.ExecContext(ctx, `TRUNCATE `+table)
		require.NoError(b, err)
		b.StartTimer()
	}
}

// BenchmarkLogParkedKeyBacklog measures a claim of an ordered log table
// while one key is parked with held messages behind it in the failed table
// (none, or 100,000): every claim sets that key's new message aside behind
// them and so looks at the failed table again. ns/op is one claim (of the
// parked key's new message, set aside, and another key's, published).
func BenchmarkLogParkedKeyBacklog(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	for _, held := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b), Ordering: outbox.OrderedByKey, MaxAttempts: 1, Logger: dbtest.Logger(b)})
			require.NoError(b, err)
			require.NoError(b, store.CreateLogSchemaIfAbsent(ctx))
			add := func(evts ...outbox.Event) {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(b, err)
				require.NoError(b, store.Add(ctx, tx, evts...))
				require.NoError(b, tx.Commit())
			}
			add(outbox.Event{Type: "p", Key: "parked", Payload: []byte("{}")})
			msgs, err := store.Claim(ctx, 10, time.Minute)
			require.NoError(b, err)
			require.NoError(b, store.MarkFailed(ctx, msgs[0], "parked"))
			_, err = db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO "%[1]s_failed" (id, seq, ord, event_type, event_key, exchange, routing_key,
	payload, content_type, headers, created_at, attempts, available_at)
SELECT gen_random_uuid(), 1000000 + i, 1000000 + i, 'p', 'parked', '', '', '\x00', 'x', '{}', now(), 0, now() FROM generate_series(1, $1::int) i`, store.Table()), held)
			require.NoError(b, err)
			_, err = db.ExecContext(ctx, `ANALYZE "`+store.Table()+`_failed"`)
			require.NoError(b, err)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				add(outbox.Event{Type: "p", Key: "parked", Payload: []byte("{}")}, outbox.Event{Type: "o", Key: fmt.Sprint("other-", i), Payload: []byte("{}")})
				b.StartTimer()
				msgs, err := store.Claim(ctx, 100, time.Minute)
				b.StopTimer()
				require.NoError(b, err)
				require.Len(b, msgs, 1, "the other key's message; the parked key's is set aside")
				require.NoError(b, store.MarkPublished(ctx, msgs...))
				b.StartTimer()
			}
		})
	}
}
