package outbox_test

// What a claim of a log table costs the database: the index blocks and
// heap blocks it reads, the looks it makes while idle, and the commits
// it waits for.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// TestLogClaimReadsNoHistory: a claim reads the index of the events it
// may take, not of those relayed before it. A claim that opens a window
// (and a take-over of a window's first batch) had two lower bounds on tx,
// one of them a row comparison from 0, and PostgreSQL's index scan began
// at the lower: every claim read the index entries of every event of the
// partition, and slowed down as it filled (the 1,000/s bench's last fifth
// 8 times slower than its first). The index reads of a store on a pool of
// one session are counted from PostgreSQL's statistics, flushed after it.
func TestLogClaimReadsNoHistory(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.noAutovacuum(t)
	const history = 20_000
	b.insertMany(t, history)
	old, err := b.store.Claim(ctx, history, time.Minute)
	require.NoError(t, err)
	require.Len(t, old, history)
	require.NoError(t, b.store.MarkPublished(ctx, old...))

	store, reads := b.countingStore(t, "idx_blks")
	b.addCommitted(t, events(3)...)

	claim := func(lease time.Duration) ([]outbox.Message, int64) {
		before := reads()
		msgs, err := store.Claim(ctx, 100, lease)
		require.NoError(t, err)
		return msgs, reads() - before
	}
	fresh, n := claim(time.Millisecond)
	require.Len(t, fresh, 3, "the new window")
	assert.Less(t, n, int64(20), "index blocks read by a claim that opens a window after %d events", history)

	// Once the lease is over by the database's clock, which judges it, and
	// the store's next look for lapsed leases is due by its own (the
	// test's), the batch is taken over and its window read again.
	b.awaitLapse(t, fresh)
	later := time.Now().Add(time.Hour)
	outbox.SetLogClock(store, func() time.Time { return later })
	again, n := claim(time.Minute)
	require.Equal(t, ids(fresh), ids(again), "taken over")
	assert.Less(t, n, int64(20), "index blocks read by the take-over")
}

// insertMany commits n events of one byte in one statement.
func (b *testBundle) insertMany(t *testing.T, n int) {
	t.Helper()
	_, err := b.db.ExecContext(context.Background(), `INSERT INTO "`+b.table+`" (id, event_type, payload)
SELECT gen_random_uuid(), 'many', '\x00' FROM generate_series(1, $1)`, n)
	require.NoError(t, err)
}

// noAutovacuum keeps autovacuum off the first partition, whose blocks
// countingStore counts: the statistics count every session's reads, and a
// vacuum of the partition (due after the thousands of inserts these tests
// make) reads its indexes. In CI one ran during a take-over and was counted
// with it: 84 index blocks where the take-over reads under 20.
func (b *testBundle) noAutovacuum(t *testing.T) {
	t.Helper()
	_, err := b.db.ExecContext(context.Background(), `ALTER TABLE "`+b.table+`_p00" SET (autovacuum_enabled = off)`)
	require.NoError(t, err)
}

// countingStore returns a store of the table on a pool of one session,
// and a function that returns how many blocks of the first partition
// (column prefix idx_blks or heap_blks) all sessions have read so far,
// counted after that session's statistics are flushed.
func (b *testBundle) countingStore(t *testing.T, blocks string) (*outbox.Store, func() int64) {
	t.Helper()
	ctx := context.Background()
	one := dbtest.NewDB(t)
	one.SetMaxOpenConns(1)
	store, err := outbox.NewStore(one, &outbox.StoreConfig{Table: b.table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	_, err = store.Layout(ctx) // read once, outside the counts
	require.NoError(t, err)
	return store, func() int64 {
		// The session's statistics reach the shared ones when it goes
		// idle after a statement that forces it, before it answers.
		_, err := one.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		return dbtest.Count(t, b.db, `SELECT coalesce(sum(`+blocks+`_hit + `+blocks+`_read), 0)::bigint FROM pg_statio_all_tables
WHERE relid = $1::regclass`, `"`+b.table+`_p00"`)
	}
}

// TestLogClaimOnAnalysedBacklog: the claims of a backlog that autovacuum
// has analysed use the generic plan (index scans in index order, under
// LIMIT). Custom plans, made for each call's values, took the partition's
// statistics to mean that the window is most of the table and read all of
// it: 23-50 ms a claim, for the first five claims of every session and
// again after each ANALYZE or TRUNCATE of a partition.
func TestLogClaimOnAnalysedBacklog(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.noAutovacuum(t)
	const backlog = 20_000
	b.insertMany(t, backlog)
	_, err := b.db.ExecContext(ctx, `ANALYZE "`+b.table+`"`)
	require.NoError(t, err)

	store, reads := b.countingStore(t, "heap_blks")
	for i := range 6 { // custom plans for the first five, unless told otherwise
		before := reads()
		msgs, err := store.Claim(ctx, 100, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 100)
		assert.Less(t, reads()-before, int64(20), "heap blocks read by claim %d of 100 of an analysed backlog of %d", i+1, backlog)
	}
}

// TestLogIdleLooksBackOff: while claims find nothing, a store looks for
// batches to take over and for failed messages due again less and less
// often (twice as long after each look, up to a quarter of the lease and
// at most 2s); a claim that finds work, a release or a failure in the
// process makes them frequent again. The store's clock is the test's.
func TestLogIdleLooksBackOff(t *testing.T) {
	ctx := context.Background()
	b, now := setupLogClock(t)
	idle := func(claims int, lease time.Duration) {
		for range claims {
			*now = now.Add(100 * time.Millisecond)
			msgs, err := b.store.Claim(ctx, 10, lease)
			require.NoError(t, err)
			require.Empty(t, msgs)
		}
	}
	require.Equal(t, 250*time.Millisecond, outbox.LogLookEvery(b.store))
	idle(40, 30*time.Second)
	assert.Equal(t, 2*time.Second, outbox.LogLookEvery(b.store), "idle, a lease of 30s")

	b.addCommitted(t, events(1)...)
	msgs, err := b.store.Claim(ctx, 10, 30*time.Second)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, 250*time.Millisecond, outbox.LogLookEvery(b.store), "after a claim that found work")
	require.NoError(t, b.store.MarkPublished(ctx, msgs...))

	idle(40, 2*time.Second)
	assert.Equal(t, 500*time.Millisecond, outbox.LogLookEvery(b.store), "idle, a lease of 2s: a quarter of it")
	idle(10, time.Minute)
	require.Equal(t, 2*time.Second, outbox.LogLookEvery(b.store))
	b.addCommitted(t, events(1)...)
	msgs, err = b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	idle(10, time.Minute)
	require.NoError(t, b.store.Release(ctx, msgs...))
	assert.Equal(t, 250*time.Millisecond, outbox.LogLookEvery(b.store), "after a release in the process")
}

// TestLogRotationSkipsABusyPartition: the rotation of the batch and settle
// tables truncates a finished partition only if it can lock it at once
// (NOWAIT): every claim reads every partition of the batch table, and
// claims would queue behind a LOCK that waited. A partition some
// transaction is reading is left for the next rotation, and no error is
// returned; once it is free, the next rotation truncates it.
func TestLogRotationSkipsABusyPartition(t *testing.T) {
	ctx := context.Background()
	b := setupLogSized(t, nil, 10, 4, 4)
	for range 12 { // batches 1 to 12: partitions 0 to 3 of 4 batch ids each
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("z")})
		require.Equal(t, 1, relayAll(t, b.store))
	}
	// The latest batch (12) is in partition 3, the next is 0: 1 and 2 are
	// finished and due.
	part1 := `"` + b.table + `_batch_p1"`
	require.Positive(t, dbtest.Count(t, b.db, `SELECT count(*) FROM `+part1))
	reader, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer reader.Rollback() //nolint:errcheck
	var n int64
	require.NoError(t, reader.QueryRowContext(ctx, `SELECT count(*) FROM `+part1).Scan(&n), "a claim's lock on the partition")

	require.NoError(t, outbox.RotateLog(ctx, b.store), "a busy partition is no error")
	assert.Positive(t, dbtest.Count(t, b.db, `SELECT count(*) FROM `+part1), "partition 1 is left while it is read")
	assert.Zero(t, dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`_batch_p2"`), "partition 2 was free")

	require.NoError(t, reader.Rollback())
	require.NoError(t, outbox.RotateLog(ctx, b.store))
	assert.Zero(t, dbtest.Count(t, b.db, `SELECT count(*) FROM `+part1), "truncated once free")
}
