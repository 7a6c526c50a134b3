package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
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
// Beside it, kernel-truncate-ms is what the kernel alone takes to truncate
// as many bytes of files in the page cache (kernelTruncate): the
// machine's floor under the figure, measured in the same run.
func BenchmarkLogPurge(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	events := dbtest.EnvInt(b, "OUTBOX_BENCH_PURGE_EVENTS", 100_000)
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
		before := partitionBytes(ctx, b, db, store.Table())
		b.StartTimer()
		started := time.Now()
		n, err := store.PurgePublished(ctx, 0)
		took := time.Since(started)
		b.StopTimer()
		close(stop) // the write in progress when the purge ended finishes, and counts, before the writer stops
		wg.Wait()
		require.NoError(b, err)
		dropped := before - partitionBytes(ctx, b, db, store.Table())
		b.ReportMetric(float64(dropped)/(1<<20), "dropped-MB")
		b.ReportMetric(kernelTruncate(b, dropped).Seconds()*1000, "kernel-truncate-ms")
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

// partitionBytes is the size of the files of the events table's
// partitions, indexes included: what a TRUNCATE of them gives back.
func partitionBytes(ctx context.Context, b *testing.B, db *sql.DB, table string) int64 {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint FROM pg_inherits AS i
WHERE i.inhparent = to_regclass($1)`, `"`+table+`"`).Scan(&n)
	require.NoError(b, err)
	return n
}

// kernelTruncate is the floor under a purge on this machine: the time the
// kernel takes to truncate files of size bytes in all, in segments of 1 GB
// as PostgreSQL keeps a relation, one after the other as its commits do.
// The files are written as PostgreSQL writes its pages, 8 KB at a time
// (written a megabyte at a time, the kernel keeps them in larger pieces of
// its page cache, which it frees about twice as fast), and synced, and so
// in the page cache and clean, as a day's history is once checkpoints have
// written it (pages still dirty truncate about twice as fast). PostgreSQL
// truncates the files of a TRUNCATEd partition at the commit, in the
// committing backend: a purge cannot take less. On a file system mounted
// with discard, both wait for the device to discard the blocks freed. The
// files are written under TMPDIR, which may be another file system than
// the database's; on the project's machine both are the root file system.
func kernelTruncate(b *testing.B, size int64) time.Duration {
	dir := b.TempDir()
	chunk := make([]byte, 8<<10)
	var files []*os.File
	for left, i := size, 0; left > 0; i++ {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		require.NoError(b, err)
		files = append(files, f)
		for seg := int64(0); seg < 1<<30 && left > 0; seg += int64(len(chunk)) {
			w, err := f.Write(chunk[:min(int64(len(chunk)), left)])
			require.NoError(b, err)
			left -= int64(w)
		}
		require.NoError(b, f.Sync())
	}
	start := time.Now()
	for _, f := range files {
		require.NoError(b, f.Truncate(0))
	}
	took := time.Since(start)
	for _, f := range files {
		require.NoError(b, f.Close())
	}
	return took
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
