package outbox_test

import (
	"context"
	"errors"
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

// setupLog gives the test its own outbox table of the log layout.
func setupLog(t *testing.T, cfg *outbox.StoreConfig) *testBundle {
	t.Helper()
	b := setupWith(t, cfg, (*outbox.Store).CreateLogSchemaIfAbsent)
	l, err := b.store.Layout(context.Background())
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l)
	return b
}

func TestLogClaimInBatches(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(10)...)

	first, err := b.store.Claim(ctx, 4, time.Minute)
	require.NoError(t, err)
	require.Len(t, first, 4)
	rest, err := b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, rest, 6)
	none, err := b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Empty(t, none)

	all := append(append([]outbox.Message(nil), first...), rest...)
	seen := map[string]bool{}
	for i, m := range all {
		assert.False(t, seen[m.ID], "claimed twice: %s", m.ID)
		seen[m.ID] = true
		assert.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(m.Payload), "in the order written")
		assert.False(t, m.ClaimedUntil.IsZero())
	}
	require.NoError(t, b.store.MarkPublished(ctx, all...))

	b.addCommitted(t, events(3)...)
	more, err := b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, more, 3, "a new window after the first was drained")
}

// A transaction that draws its seq (and its tx id) before others and
// commits after them is taken in the window in which its commit becomes
// visible: a cursor over seq would skip it.
func TestLogLateCommitNotSkipped(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)

	late, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer late.Rollback() //nolint:errcheck
	require.NoError(t, b.store.Add(ctx, late, outbox.Event{Type: "late", Payload: []byte("late")}))

	b.addCommitted(t, events(3)...)
	got, err := b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, got, 3, "the open transaction is not visible yet")
	require.NoError(t, b.store.MarkPublished(ctx, got...))

	// Several windows go by while it stays open.
	for i := 0; i < 3; i++ {
		b.addCommitted(t, outbox.Event{Type: "t", Payload: []byte("x")})
		got, err := b.store.Claim(ctx, 100, time.Minute)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.NoError(t, b.store.MarkPublished(ctx, got...))
	}
	require.NoError(t, late.Commit())
	got, err = b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "late", got[0].EventType)
	assert.Equal(t, int64(1), got[0].Seq, "it drew the first seq")
}

// Writers whose transactions commit in an order unrelated to their ids,
// and claimers running beside them: every committed event is claimed
// exactly once (nothing is released or expires here), none of the rolled
// back ones is.
func TestLogConcurrentWritersAndClaimers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := setupLog(t, nil)
	const writers, perWriter = 6, 150

	var (
		mu        sync.Mutex
		committed = map[string]bool{}
		claimed   = map[string]int{}
		wg        sync.WaitGroup
		done      = make(chan struct{})
	)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				tx, err := b.db.BeginTx(ctx, nil)
				if !assert.NoError(t, err) {
					return
				}
				ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "c", Payload: []byte("x")}, outbox.Event{Type: "c", Payload: []byte("y")})
				if !assert.NoError(t, err) {
					return
				}
				if d := rand.IntN(3); d > 0 {
					time.Sleep(time.Duration(d) * time.Millisecond) // let others commit first
				}
				if rand.IntN(10) == 0 {
					assert.NoError(t, tx.Rollback())
					continue
				}
				if !assert.NoError(t, tx.Commit()) {
					return
				}
				mu.Lock()
				for _, id := range ids {
					committed[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	var cw sync.WaitGroup
	claimOnce := func() int {
		msgs, err := b.store.Claim(ctx, 7, time.Minute)
		if !assert.NoError(t, err) {
			return 0
		}
		mu.Lock()
		for _, m := range msgs {
			claimed[m.ID]++
		}
		mu.Unlock()
		assert.NoError(t, b.store.MarkPublished(ctx, msgs...))
		return len(msgs)
	}
	for c := 0; c < 3; c++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				claimOnce()
			}
		}()
	}
	wg.Wait()
	close(done)
	cw.Wait()
	for claimOnce() > 0 {
	}
	require.NotEmpty(t, committed)
	for id := range committed {
		assert.Equal(t, 1, claimed[id], "committed event %s claimed once", id)
	}
	for id := range claimed {
		assert.True(t, committed[id], "claimed event %s was committed", id)
	}
}

func TestLogLeaseExpiryTakeOver(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(5)...)

	first, err := b.store.Claim(ctx, 5, 50*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, first, 5)
	require.NoError(t, b.store.MarkPublished(ctx, first[:2]...))

	var again []outbox.Message
	require.Eventually(t, func() bool {
		again, err = b.store.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		return len(again) > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, ids(first[2:]), ids(again), "the unpublished ones, after the lease")

	err = b.store.MarkPublished(ctx, first[2:]...)
	var lost *outbox.LeaseLostError
	require.ErrorAs(t, err, &lost)
	assert.ElementsMatch(t, ids(first[2:]), lost.IDs)
	require.NoError(t, b.store.MarkPublished(ctx, again...))

	none, err := b.store.Claim(ctx, 10, 50*time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestLogRelease(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(4)...)
	msgs, err := b.store.Claim(ctx, 4, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.MarkPublished(ctx, msgs[0]))
	require.NoError(t, b.store.Release(ctx, msgs[1:]...))

	again, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, ids(msgs[1:]), ids(again), "released messages come back at once")
}

func TestLogFailureBackoffAndParking(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, &outbox.StoreConfig{MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 }})
	b.addCommitted(t, outbox.Event{Type: "bad", Payload: []byte("bad"), Headers: map[string]string{"h": "v"}}, outbox.Event{Type: "good", Payload: []byte("good")})

	msgs, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	bad := msgs[0]
	require.NoError(t, b.store.MarkPublished(ctx, msgs[1]))
	for attempt := 1; attempt <= 3; attempt++ {
		require.NoError(t, b.store.MarkFailed(ctx, bad, fmt.Sprintf("no %d", attempt)))
		if attempt == 3 {
			break
		}
		again, err := b.store.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, again, 1)
		bad = again[0]
		assert.Equal(t, attempt, bad.Attempts)
		assert.Equal(t, fmt.Sprintf("no %d", attempt), bad.LastError)
		assert.Equal(t, "bad", string(bad.Payload))
		assert.Equal(t, map[string]string{"h": "v"}, bad.Headers)
	}
	none, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, none, "parked")

	parked, err := b.store.Parked(ctx, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, 3, parked[0].Attempts)
	n, err := b.store.Retry(ctx, parked[0].ID)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	again, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.NoError(t, b.store.MarkPublished(ctx, again...))
	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Pending)
	assert.Zero(t, st.Parked)
}

// setupLogSized is setupLog with partitions of chunk events over parts
// partitions, and batch partitions of batchChunk batches.
func setupLogSized(t *testing.T, cfg *outbox.StoreConfig, chunk, parts, batchChunk int64) *testBundle {
	t.Helper()
	return setupWith(t, cfg, func(s *outbox.Store, ctx context.Context) error {
		ddl, err := outbox.LogSchemaSized(s.Table(), chunk, parts, batchChunk)
		if err != nil {
			return err
		}
		_, err = dbtest.DB(t).ExecContext(ctx, ddl)
		return err
	})
}

// relayAll claims and publishes until nothing is left, and returns how
// many messages it published.
func relayAll(t *testing.T, s *outbox.Store) int {
	t.Helper()
	ctx := context.Background()
	total := 0
	for {
		msgs, err := s.Claim(ctx, 7, time.Minute)
		require.NoError(t, err)
		if len(msgs) == 0 {
			return total
		}
		require.NoError(t, s.MarkPublished(ctx, msgs...))
		total += len(msgs)
	}
}

// History goes away by TRUNCATE of whole partitions, only once everything
// in them is settled; relaying and purging leave no dead tuples in the
// events table, and the bookkeeping tables are emptied by rotation too.
func TestLogPurgeTruncatesSettledPartitions(t *testing.T) {
	ctx := context.Background()
	b := setupLogSized(t, nil, 10, 4, 4)
	// pgstattuple reads the pages themselves: the statistics' n_dead_tup
	// lags behind the other sessions of the pool, and a zero from it
	// could not fail.
	_, err := b.db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple`)
	require.NoError(t, err, "pgstattuple ships with PostgreSQL (contrib)")
	deadTuples := func(parent string) int64 {
		return dbtest.Count(t, b.db, `SELECT coalesce(sum((pgstattuple(inhrelid)).dead_tuple_count), 0) FROM pg_inherits
WHERE inhparent = $1::regclass`, parent)
	}
	events := `"` + b.table + `"`

	// 25 events: seq 1..25, partitions 0 (1–9), 1 (10–19), 2 (20–25).
	for i := 0; i < 25; i++ {
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("x")})
	}
	// Nothing relayed yet: nothing may go.
	n, err := b.store.Purgeable(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n)

	msgs, err := b.store.Claim(ctx, 15, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 15)
	require.NoError(t, b.store.MarkPublished(ctx, msgs[:12]...))
	// Partition 0 is published; partition 1 is not all published yet, and
	// writers are in partition 2, next to 3.
	n, err = b.store.PurgePublished(ctx, 0)
	require.NoError(t, err)
	assert.Zero(t, n, "writers are in partition 2; partition 0 (cur+2) waits for the rotation, or a purge once writers move on")

	require.NoError(t, b.store.MarkPublished(ctx, msgs[12:]...))
	assert.Equal(t, 10, relayAll(t, b.store))
	for i := 0; i < 10; i++ { // writers move to partition 3 (seq 30–35)
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("y")})
	}
	n, err = b.store.Purgeable(ctx, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is an hour old")
	n, err = b.store.Purgeable(ctx, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 10, n, "partition 1 (seq 10–19); writers are in 3, and 0 is next")
	n, err = b.store.PurgePublished(ctx, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 10, n)
	assert.EqualValues(t, 25, b.count(t, ""), "seq 1–9 and 20–35 are left")

	// The 10 unpublished ones are still there to relay, and the rotation
	// (every second, from claims) empties what is settled ahead of the
	// writers.
	assert.Equal(t, 10, relayAll(t, b.store))
	assert.Zero(t, deadTuples(events), "relaying and purging left no dead tuples in the events table")
	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Pending)
	assert.EqualValues(t, 0, st.Parked)

	// Many small batches: the batch and settle tables are rotated by
	// TRUNCATE, and stay small.
	for i := 0; i < 40; i++ {
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("z")})
		require.Equal(t, 1, relayAll(t, b.store))
	}
	require.NoError(t, outbox.RotateLog(ctx, b.store))
	latest := dbtest.Count(t, b.db, `SELECT max(batch_id) FROM "`+b.table+`_batch"`)
	cur := (latest / 4) % 4
	assert.Zero(t, dbtest.Count(t, b.db, fmt.Sprintf(`SELECT count(*) FROM "%s_batch" WHERE (batch_id / 4) %% 4 NOT IN (%d, %d)`, b.table, cur, (cur+1)%4)),
		"only the partition of the latest batch and the next one are left")
	assert.Positive(t, dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`_batch" WHERE batch_id = `+fmt.Sprint(latest)), "the cursor is kept")
	assert.Zero(t, deadTuples(events))
	assert.Zero(t, deadTuples(`"`+b.table+`_batch"`)+deadTuples(`"`+b.table+`_settle"`), "nor in the bookkeeping tables")
}

// A table of the rows layout is converted online: what was not published
// is in the new table (failed ones with their attempts), the history stays
// in the old one, and a Store that knew the old layout finds the new one
// at its next claim; its claims from before are lost leases.
func TestConvertToLog(t *testing.T) {
	ctx := context.Background()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
	b.addCommitted(t, events(7)...)
	old := b.store
	msgs, err := old.Claim(ctx, 7, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 7)
	require.NoError(t, old.MarkPublished(ctx, msgs[0]))
	require.NoError(t, old.MarkFailed(ctx, msgs[1], "once"))
	require.NoError(t, old.MarkFailed(ctx, msgs[6], "first"))
	require.NoError(t, old.Release(ctx, msgs[4], msgs[5]))
	again, err := old.Claim(ctx, 7, time.Minute)
	require.NoError(t, err)
	for _, m := range again {
		if m.ID == msgs[6].ID {
			require.NoError(t, old.MarkFailed(ctx, m, "second: parked"))
		} else {
			require.NoError(t, old.Release(ctx, m))
		}
	}
	// msgs[2] and msgs[3] are in flight at old.

	conv, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	dry, err := conv.ConvertToLog(ctx, true, time.Second)
	require.NoError(t, err)
	assert.EqualValues(t, 4, dry.Pending, "two in flight, two released")
	assert.EqualValues(t, 2, dry.Failed, "one backing off, one parked")
	assert.EqualValues(t, 1, dry.History)
	l, err := conv.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutRows, l, "a dry run changes nothing")

	done, err := conv.ConvertToLog(ctx, false, time.Second)
	require.NoError(t, err)
	assert.Equal(t, dry.Pending, done.Pending)
	assert.Equal(t, b.table+"_rows", done.OldTable)
	l, err = conv.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l)
	assert.EqualValues(t, 7, dbtest.Count(t, b.db, `SELECT count(*) FROM "`+done.OldTable+`"`), "the history stays in the old table")
	_, err = conv.ConvertToLog(ctx, false, time.Second)
	require.ErrorContains(t, err, "has the log layout already")

	// The store that knew the rows layout: its next statement fails and
	// makes it look again; its claims from before are lost leases.
	err = old.MarkPublished(ctx, msgs[2])
	if err != nil && !errors.Is(err, outbox.ErrLeaseLost) {
		err = old.MarkPublished(ctx, msgs[2])
	}
	require.ErrorIs(t, err, outbox.ErrLeaseLost)
	b.addCommitted(t, outbox.Event{Type: "after"}) // writers write on, into the new table
	var got []outbox.Message
	require.Eventually(t, func() bool {
		more, err := old.Claim(ctx, 10, time.Minute)
		if err == nil {
			got = append(got, more...)
		}
		return len(got) >= 6
	}, 10*time.Second, 10*time.Millisecond)
	want := []string{msgs[1].ID, msgs[2].ID, msgs[3].ID, msgs[4].ID, msgs[5].ID}
	gotIDs := ids(got)
	assert.Subset(t, gotIDs, want, "every unpublished, unparked message is claimed again")
	assert.Len(t, gotIDs, 6, "and the one written after")
	for _, m := range got {
		if m.ID == msgs[1].ID {
			assert.Equal(t, 1, m.Attempts, "its attempt came along")
		}
	}
	parked, err := old.Parked(ctx, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, msgs[6].ID, parked[0].ID)
	assert.Equal(t, "second: parked", parked[0].LastError)
	require.NoError(t, old.MarkPublished(ctx, got...))
}

// A table with the NOTIFY trigger keeps waking relays once converted, and
// the old table, renamed, keeps no trigger of its writers.
func TestConvertToLogMovesNotifyTrigger(t *testing.T) {
	ctx := context.Background()
	b := setup(t, nil)
	ddl, err := outbox.NotifySchema(b.table)
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, ddl)
	require.NoError(t, err)
	c, err := b.store.ConvertToLog(ctx, false, time.Second)
	require.NoError(t, err)
	has, err := b.store.HasNotifyTrigger(ctx)
	require.NoError(t, err)
	require.True(t, has, "the new table has it")
	require.Zero(t, dbtest.Count(t, b.db, `SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal`, `"`+c.OldTable+`"`),
		"the old table has none")
}

// A log table of version 1 (before ordered log tables: no ord columns, no
// batch keys, the claim function of four arguments) is refused with the
// way to bring it up to date, which the schema's DDL does, on a table with
// messages waiting.
func TestLogVersion1BroughtUpToDate(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(3)...)
	q := func(s string) string { return strings.ReplaceAll(s, "{t}", b.table) }
	for _, stmt := range []string{
		q(`DROP FUNCTION "{t}_claim"(integer, bigint, bigint, uuid, bigint)`), q(`DROP VIEW "{t}_messages"`), // reads ord
		q(`ALTER TABLE "{t}" DROP COLUMN ord`), q(`DROP SEQUENCE IF EXISTS "{t}_ord_seq"`), /* owned by ord: gone with it */
		q(`ALTER TABLE "{t}_failed" DROP COLUMN ord`), q(`ALTER TABLE "{t}_batch" DROP COLUMN keys`),
		q(`ALTER TABLE "{t}_log" DROP COLUMN ordered_from`), q(`UPDATE "{t}_log" SET version = 1`),
	} {
		_, err := b.db.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	old, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.table})
	require.NoError(t, err)
	l, err := old.Layout(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidTable)
	require.NotContains(t, err.Error(), "table name", "the name is fine; the layout is old")
	require.ErrorContains(t, err, "version 1, before this version of the library")
	require.ErrorContains(t, err, "outbox schema --layout log --apply")
	require.Equal(t, outbox.LayoutLog, l, "a log table, of an earlier version")

	require.NoError(t, old.CreateLogSchemaIfAbsent(ctx))
	l, err = old.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l)
	assert.Equal(t, 3, relayAll(t, old), "the messages waiting are relayed")
}
