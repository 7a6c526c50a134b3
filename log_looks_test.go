package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/syncbuf"
)

// TestLogMaintainMakesTheLooks: while Store.Maintain is called, claims
// leave the looks for batches to take over to it and only take what a
// look found; once it is no longer called (a second), claims make the
// looks themselves again. The store's clock is the test's; leases are
// judged by the database's.
func TestLogMaintainMakesTheLooks(t *testing.T) {
	ctx := context.Background()
	b, now := setupLogClock(t)
	require.NoError(t, b.store.Maintain(ctx), "on an empty table")

	b.addCommitted(t, events(2)...)
	taken, err := b.store.Claim(ctx, 10, time.Millisecond)
	require.NoError(t, err)
	require.Len(t, taken, 2)
	b.awaitLapse(t, taken)

	*now = now.Add(500 * time.Millisecond) // a look is due, and Maintain was called within a second
	msgs, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, msgs, "a claim looked for batches to take over while Maintain makes the looks")

	require.NoError(t, b.store.Maintain(ctx))
	again, err := b.store.Claim(ctx, 10, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, ids(taken), ids(again), "taken over after Maintain's look found the batch")
	b.awaitLapse(t, again)

	*now = now.Add(2 * time.Second) // Maintain not called for two seconds
	third, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, ids(taken), ids(third), "taken over by a claim's own look once Maintain stopped")
	require.NoError(t, b.store.MarkPublished(ctx, third...))
}

// TestLogMaintainRotates: Maintain rotates the batch and settle tables
// (every second by the store's clock), as claims do when nothing calls it.
func TestLogMaintainRotates(t *testing.T) {
	ctx := context.Background()
	b := setupSmallLog(t)
	now := time.Now()
	outbox.SetLogClock(b.store, func() time.Time { return now })
	require.NoError(t, b.store.Maintain(ctx))
	for range 12 { // batches 1 to 12: partitions 0 to 3 of 4 batch ids each
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("z")})
		require.Equal(t, 1, relayAll(t, b.store))
	}
	part1 := `"` + b.table + `_batch_p1"`
	require.Positive(t, dbtest.Count(t, b.db, `SELECT count(*) FROM `+part1), "claims left the rotation to Maintain")
	now = now.Add(time.Second)
	require.NoError(t, b.store.Maintain(ctx))
	assert.Zero(t, dbtest.Count(t, b.db, `SELECT count(*) FROM `+part1), "finished partition 1 rotated")
	assert.Zero(t, dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`_batch_p2"`), "finished partition 2 rotated")
}

// TestLogRotationKeepsUpAcrossWraps: the rotation remembers which
// partitions it found empty, to look at them again only when writers or
// batch ids move on, and keeps emptying the partitions behind them as
// they go round four times (events) and twice (batches): the table holds
// no more than three partitions of events and two of batches at any time.
func TestLogRotationKeepsUpAcrossWraps(t *testing.T) {
	ctx := context.Background()
	b := setupSmallLog(t)
	now := time.Now()
	outbox.SetLogClock(b.store, func() time.Time { return now })
	for step := range 16 { // 10 events a step; 2 batches of 7 and 3
		evts := make([]outbox.Event, 10)
		for i := range evts {
			evts[i] = outbox.Event{Type: "e", Payload: []byte("z")}
		}
		b.addCommitted(t, evts...)
		require.Equal(t, 10, relayAll(t, b.store))
		require.NoError(t, b.store.Maintain(ctx))
		now = now.Add(time.Second)
		require.NoError(t, b.store.Maintain(ctx)) // the rotation is due every second
		events := dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`"`)
		batches := dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`_batch"`)
		require.LessOrEqual(t, events, int64(30), "step %d: the partition after the next one emptied", step)
		require.LessOrEqual(t, batches, int64(8), "step %d: finished batch partitions emptied", step)
	}
	assert.Equal(t, int64(160), dbtest.Count(t, b.db, `SELECT coalesce(max(seq), 0) FROM "`+b.table+`"`), "the writers went round four times")
}

// TestMaintainOnRows: a table of LayoutRows needs no upkeep.
func TestMaintainOnRows(t *testing.T) {
	b := setup(t, nil)
	require.NoError(t, b.store.Maintain(context.Background()))
	var noPool outbox.Store
	require.ErrorIs(t, noPool.Maintain(context.Background()), outbox.ErrNoPool)
}

// awaitLapse waits until the lease of msgs (a short one) is over by the
// database's clock, which judges it.
func (b *testBundle) awaitLapse(t *testing.T, msgs []outbox.Message) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); dbtest.Count(t, b.db, `SELECT count(*) FROM (SELECT WHERE now() > $1) AS x`, msgs[0].ClaimedUntil) == 0; {
		require.True(t, time.Now().Before(deadline), "the lease not over in 10s")
	}
}

// setupSmallLog is a log table of partitions of 10 events (4 of them)
// and of 4 batches, its layout read.
func setupSmallLog(t *testing.T) *testBundle {
	t.Helper()
	b := setupLogSized(t, nil, 10, 4, 4)
	_, err := b.store.Layout(context.Background())
	require.NoError(t, err)
	return b
}

// setupLogClock is setupLog whose store tells the time from *now (set to
// the present), which the test moves on.
func setupLogClock(t *testing.T) (*testBundle, *time.Time) {
	t.Helper()
	b := setupLog(t, nil)
	_, err := b.store.Layout(context.Background())
	require.NoError(t, err)
	now := time.Now()
	outbox.SetLogClock(b.store, func() time.Time { return now })
	return b, &now
}

// A table whose claim function predates this version's (its revision
// mark) is relayed as before, and every store that opens it says how to
// replace the function; once replaced, none does.
func TestLogOlderClaimFunctionReported(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	open := func() string {
		var logs syncbuf.Buffer
		st, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: b.table, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		l, err := st.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.LayoutLog, l)
		b.addCommitted(t, events(1)...)
		msgs, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 1, "relayed as before")
		require.NoError(t, st.MarkPublished(ctx, msgs...))
		return logs.String()
	}
	assert.NotContains(t, open(), "claim function", "the function this version creates")

	_, err := b.db.ExecContext(ctx, `COMMENT ON FUNCTION "`+b.table+`_claim"(integer, bigint, bigint, uuid, bigint) IS NULL`)
	require.NoError(t, err)
	logs := open()
	assert.Contains(t, logs, "claim function is older", "a function without the mark")
	assert.Contains(t, logs, "claim_revision=1")
	assert.Contains(t, logs, "outbox schema --layout log --apply")

	require.NoError(t, b.store.CreateLogSchemaIfAbsent(ctx))
	assert.NotContains(t, open(), "claim function", "replaced")
}
