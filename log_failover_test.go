package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 45: a failover with asynchronous replication loses the old
// primary's last commits, and the new primary gives out again the batch
// ids and seqs it never saw. A relay that claimed such a batch on the old
// primary, and settles it on the new one, must find its lease lost: its
// batch id and gen now name another claim's batch, and its seqs other
// events. Here the lost tail is made by hand (the batch row and its events
// deleted, the sequence set back), the new events then take the same batch
// id and seqs, and the old claim's marks must leave them pending.
// Before batch rows were fenced by their claim's token, the old mark was
// accepted and the new events counted as published, unpublished: lost.
func TestLogSettleAfterLostTailFindsLeaseLost(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(3)...)
	old, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, old, 3)

	// The tail lost with the old primary: the claim's batch row, its
	// events, and the sequence's advance.
	seq := b.table + "_seq"
	var low int64
	require.NoError(t, b.db.QueryRowContext(ctx, `SELECT min(seq) FROM "`+b.table+`"`).Scan(&low))
	for _, q := range []string{
		`DELETE FROM "` + b.table + `_batch"`,
		`DELETE FROM "` + b.table + `"`,
	} {
		_, err := b.db.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}
	_, err = b.db.ExecContext(ctx, `SELECT setval($1::regclass, $2, false)`, `"`+seq+`"`, low)
	require.NoError(t, err)

	// On the new primary: other events, the same seqs, the same batch.
	b.addCommitted(t, events(3)...)
	fresh, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, fresh, 3)
	for i := range fresh {
		require.Equal(t, old[i].Seq, fresh[i].Seq, "the new primary reuses the seqs (the test's premise)")
		require.NotEqual(t, old[i].ID, fresh[i].ID)
	}
	var batches int64
	require.NoError(t, b.db.QueryRowContext(ctx, `SELECT count(*) FROM "`+b.table+`_batch"`).Scan(&batches))
	require.EqualValues(t, 1, batches)

	// The old claim's marks: lease lost, whatever they say.
	var lost *outbox.LeaseLostError
	require.ErrorAs(t, b.store.MarkPublished(ctx, old...), &lost)
	require.ElementsMatch(t, ids(old), lost.IDs)
	require.ErrorAs(t, b.store.MarkFailed(ctx, old[0], "from the old primary"), &lost)
	require.ErrorAs(t, b.store.Release(ctx, old[1:]...), &lost)
	pending, err := b.store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, pending, "the new events are still to be published")

	require.NoError(t, b.store.MarkPublished(ctx, fresh...))
	pending, err = b.store.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, pending)
}

// Issue 45: a store learns, as it looks for batches to take over, that no
// batch below its low-water mark is unfinished, and looks from there on.
// After a failover with asynchronous replication the new primary may have
// lost the settles that finished them: here a message's failure (its
// settle and its row in the failed table), made by hand. A store that kept
// its mark from the old primary never took that batch again, and the
// message was never published. The mark is now kept with the server it was
// learnt from (when it started), and a look on another server reads from
// the first batch again.
func TestLogLowWaterMarkForgottenOnAnotherServer(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	var skip atomic.Int64 // the store's clock runs ahead, to make its looks due
	outbox.SetLogClock(b.store, func() time.Time { return time.Now().Add(time.Duration(skip.Load())) })
	look := func() {
		skip.Add(int64(time.Hour))
		require.NoError(t, b.store.Maintain(ctx))
	}
	b.addCommitted(t, events(1)...)
	first, err := b.store.Claim(ctx, 10, 300*time.Millisecond)
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.NoError(t, b.store.MarkFailed(ctx, first[0], "the broker refused it"))
	b.addCommitted(t, events(1)...)
	second, err := b.store.Claim(ctx, 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, second, 1)
	look() // batch 1 finished, batch 2 not
	require.EqualValues(t, 2, outbox.LogLow(b.store), "the test's premise: the mark past the finished batch")

	// The tail the new primary lost: batch 1's failure.
	for _, q := range []string{
		`DELETE FROM "` + b.table + `_settle" WHERE batch_id = 1`,
		`DELETE FROM "` + b.table + `_failed"`,
	} {
		_, err := b.db.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}
	require.NoError(t, dbtest.Await(ctx, 10*time.Second, func() bool {
		var due bool
		err := b.db.QueryRowContext(ctx, `SELECT lease_until < now() FROM "`+b.table+`_batch" WHERE batch_id = 1`).Scan(&due)
		return err == nil && due
	}), "batch 1's lease ran out")
	look()
	msgs, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, msgs, "the test's premise: on the same server, the mark hides batch 1")

	outbox.SetLogServer(b.store, "the old primary")
	var again []outbox.Message
	require.NoError(t, dbtest.Await(ctx, 10*time.Second, func() bool {
		look()
		msgs, err := b.store.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		again = append(again, msgs...)
		return len(again) > 0
	}), "batch 1 taken over on the new server")
	require.Equal(t, []string{first[0].ID}, ids(again))
}
