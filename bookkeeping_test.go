package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// TestRowsBookkeepingCommitsAsynchronously: on a table of the rows layout,
// in both modes, a claim, a mark and a release commit with
// synchronous_commit off (for their own transaction only), as a log
// table's claims and settles do (outbox.asyncCommit): a crash of the
// database can then cost duplicates, never a message. The statements are
// run in a transaction of the test's, which can read the setting they
// leave; a failure is recorded as every write is, synchronously.
func TestRowsBookkeepingCommitsAsynchronously(t *testing.T) {
	for _, mode := range []outbox.Ordering{outbox.Unordered, outbox.OrderedByKey} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, &outbox.StoreConfig{Ordering: mode})
			b.addCommitted(t, events(4)...)
			claim, markPublished, release, markFailed := outbox.RowsSettleSQL(b.store)
			conn, err := b.db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			require.Equal(t, "on", syncCommit(t, conn), "the session's own setting")
			// run runs a statement in a transaction of its own, and returns
			// the ids it returned (its first column) with the setting it left.
			run := func(what, query string, args ...any) ([]string, string) {
				tx, err := conn.BeginTx(ctx, nil)
				require.NoError(t, err, what)
				rows, err := tx.QueryContext(ctx, query, args...)
				require.NoError(t, err, what)
				cols, err := rows.Columns()
				require.NoError(t, err, what)
				var ids []string
				for rows.Next() {
					var id string // or a failure's attempts
					dest := []any{&id}
					for range cols[1:] {
						dest = append(dest, new(any))
					}
					require.NoError(t, rows.Scan(dest...), what)
					ids = append(ids, id)
				}
				require.NoError(t, rows.Err(), what)
				s := syncCommit(t, tx)
				require.NoError(t, tx.Commit(), what)
				assert.Equal(t, "on", syncCommit(t, conn), "%s: for its own transaction only", what)
				return ids, s
			}
			token := uuid.NewString()
			ids, s := run("a claim", claim, 10, time.Minute.Microseconds(), token, 1<<20)
			require.Len(t, ids, 4, "the claim took the messages")
			assert.Equal(t, "off", s, "after a claim")
			published, s := run("a mark", markPublished, ids[:2], token)
			assert.ElementsMatch(t, ids[:2], published, "marked published")
			assert.Equal(t, "off", s, "after a mark")
			released, s := run("a release", release, ids[2:], token)
			assert.ElementsMatch(t, ids[2:], released, "released")
			assert.Equal(t, "off", s, "after a release")
			assert.Equal(t, int64(2), b.count(t, "published_at IS NOT NULL"), "the marks were recorded")

			// A failure is recorded as every write is.
			token = uuid.NewString()
			ids, _ = run("a claim", claim, 10, time.Minute.Microseconds(), token, 1<<20)
			require.Len(t, ids, 2, "what was released")
			failed, s := run("a failure", markFailed, ids[0], token, "refused", time.Second.Microseconds(), 5)
			require.Len(t, failed, 1, "the failure was recorded")
			assert.Equal(t, "on", s, "after a failure")
		})
	}
}

// TestLogBookkeepingCommitsAsynchronously: a claim's transaction and a
// settle's commit with synchronous_commit off (for that transaction only),
// so that the relay's two commits a batch or more do not each wait for a
// flush of the WAL; a database crash can then cost duplicates, never a
// message (outbox.asyncCommit). The statements are run in a transaction
// of the test's, which can read the setting they leave.
func TestLogBookkeepingCommitsAsynchronously(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(3)...)
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "on", syncCommit(t, conn), "the session's own setting")

	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // a failed check must not leave conn.Close waiting
	var (
		batch int64
		seqs  []int64
	)
	token := uuid.NewString()
	rows, err := tx.QueryContext(ctx, `SELECT c.batch_id, c.seq FROM (`+outbox.LogClaimSQL(b.store)+`) AS c`,
		10, time.Minute.Microseconds(), 1<<20, token, 0)
	require.NoError(t, err)
	for rows.Next() {
		var seq int64
		require.NoError(t, rows.Scan(&batch, &seq))
		seqs = append(seqs, seq)
	}
	require.NoError(t, rows.Err())
	require.Len(t, seqs, 3)
	assert.Equal(t, "off", syncCommit(t, tx), "after a claim")
	require.NoError(t, tx.Commit())
	assert.Equal(t, "on", syncCommit(t, conn), "for the claim's transaction only")

	tx, err = conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	res, err := tx.ExecContext(ctx, outbox.LogSettleSQL(b.store), batch, 0, "p", seqs, token)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the settle was recorded")
	assert.Equal(t, "off", syncCommit(t, tx), "after a settle")
	require.NoError(t, tx.Commit())
	assert.Equal(t, "on", syncCommit(t, conn), "for the settle's transaction only")

	none, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	assert.Empty(t, none, "the batch claimed and settled by hand is done")
}

// rowQuerier is a connection or a transaction.
type rowQuerier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// syncCommit reads synchronous_commit through q.
func syncCommit(t *testing.T, q rowQuerier) string {
	t.Helper()
	var s string
	require.NoError(t, q.QueryRowContext(context.Background(), `SHOW synchronous_commit`).Scan(&s))
	return s
}
