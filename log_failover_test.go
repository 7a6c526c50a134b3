package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
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
