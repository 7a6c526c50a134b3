package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// tableV1 creates a table of the test's own as migration 000001 alone
// made it: the first version.
func tableV1(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	v1, err := outbox.SchemaV1(table)
	require.NoError(t, err)
	_, err = db.Exec(v1)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "` + table + `"`) })
	return db, table
}

// TestUpgradeFromVersion1: a table created by migration 000001 alone, with
// published, parked and waiting rows, upgraded by the statements of
// migration 000002 (part of Schema): the waiting rows are numbered in the
// order of their ids, the published ones are left alone, the first
// version's claim index is gone, and both modes claim in order, the old
// rows before the new.
func TestUpgradeFromVersion1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, table := tableV1(t)

	// Rows written by a store of the first version: Add names no column of
	// the second.
	old, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	b := &testBundle{db: db, table: table, store: old}
	for i := range 6 {
		b.addCommitted(t, keyed("a", i))
	}
	_, err = db.ExecContext(ctx, `UPDATE "`+table+`" SET published_at = now() WHERE id = (SELECT id FROM "`+table+`" ORDER BY id LIMIT 1)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `UPDATE "`+table+`" SET parked_at = now(), attempts = 10 WHERE id = (SELECT id FROM "`+table+`" ORDER BY id DESC LIMIT 1)`)
	require.NoError(t, err)

	up, err := outbox.RowsSchema(table)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, up)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, up)
	require.NoError(t, err, "the upgrade runs twice without harm")

	require.EqualValues(t, 1, b.count(t, "seq IS NULL AND published_at IS NOT NULL"), "published history is not numbered")
	require.Zero(t, b.count(t, "seq IS NULL AND published_at IS NULL"))
	require.EqualValues(t, 5, b.count(t, "seq IS NOT NULL"))
	require.Zero(t, dbtest.Count(t, db, "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2", table, table+"_claim_idx"))
	require.EqualValues(t, 1, dbtest.Count(t, db, "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2", table, table+"_claim_seq_idx"))
	var idOrder, seqOrder []string
	rows, err := db.QueryContext(ctx, `SELECT id, row_number() OVER (ORDER BY seq) FROM "`+table+`" WHERE seq IS NOT NULL ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		idOrder, seqOrder = append(idOrder, id), append(seqOrder, fmt.Sprint(n))
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, seqOrder, "numbered in the order of their ids: %v", idOrder)

	// In ordered mode the parked row blocks its key; after a discard the
	// old rows come first, then a row written after the upgrade.
	ordered, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	b.store = ordered
	b.addCommitted(t, keyed("b", 0))
	_, got := claimed(t, ordered, 10)
	require.Equal(t, []string{p("a", 1), p("a", 2), p("a", 3), p("a", 4), p("b", 0)}, got,
		"the parked a5 was written after a1-a4: it blocks nothing before it")
	msgs, err := ordered.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, msgs)
}
