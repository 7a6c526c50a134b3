package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// freshStore is a Store on table that has not read its layout yet.
func freshStore(t *testing.T, db *sql.DB, table string) *outbox.Store {
	t.Helper()
	s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	return s
}

// Issue 47, item 5: a marker row edited or deleted by hand is refused with
// an error wrapping ErrInvalidTable that says what is wrong (chunk = 0
// made the relays divide by zero, parts = -3 was taken), and `outbox
// schema --apply` (CreateLogSchemaIfAbsent) sets it back from what the
// tables are partitioned by, not from the defaults.
func TestLogMetaRowCheckedAndRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLogSized(t, nil, 10, 4, 4)
	b.addCommitted(t, events(3)...)
	for _, c := range []struct{ edit, says string }{
		{`UPDATE {meta} SET chunk = 0`, "says chunk 0, parts 4"},
		{`UPDATE {meta} SET chunk = -1`, "says chunk -1"},
		{`UPDATE {meta} SET chunk = 7`, "says chunk 7"},
		{`UPDATE {meta} SET parts = 0`, "parts 0"},
		{`UPDATE {meta} SET parts = -3`, "parts -3"},
		{`UPDATE {meta} SET batch_chunk = 0`, "batch_chunk 0"},
		{`UPDATE {meta} SET batch_chunk = -2`, "batch_chunk -2"},
		{`UPDATE {meta} SET batch_parts = 0`, "batch_parts 0"},
		{`INSERT INTO {meta} SELECT * FROM {meta}`, "(2 row(s))"},
		{`DELETE FROM {meta}`, "marker row is missing"},
	} {
		_, err := b.db.ExecContext(ctx, strings.ReplaceAll(c.edit, "{meta}", `"`+b.table+`_log"`))
		require.NoError(t, err)
		s := freshStore(t, b.db, b.table)
		l, err := s.Layout(ctx)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, c.edit)
		require.ErrorContains(t, err, c.says, c.edit)
		require.ErrorContains(t, err, "outbox schema --layout log --apply", c.edit)
		require.Equal(t, outbox.LayoutLog, l, "%s: schema --apply may mend it", c.edit)
		_, err = s.Claim(ctx, 10, time.Minute)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, c.edit)
		require.ErrorIs(t, s.Maintain(ctx), outbox.ErrInvalidTable, c.edit)
		t.Logf("%s: %v", c.edit, err)

		require.NoError(t, freshStore(t, b.db, b.table).CreateLogSchemaIfAbsent(ctx), c.edit)
		var version, chunk, parts, bchunk, bparts, rows int64
		require.NoError(t, b.db.QueryRowContext(ctx, `SELECT min(version), min(chunk), min(parts), min(batch_chunk), min(batch_parts), count(*) FROM "`+b.table+`_log"`).
			Scan(&version, &chunk, &parts, &bchunk, &bparts, &rows))
		require.Equal(t, []int64{2, 10, 4, 4, 4, 1}, []int64{version, chunk, parts, bchunk, bparts, rows}, "%s: set back", c.edit)
		_, err = freshStore(t, b.db, b.table).Layout(ctx)
		require.NoError(t, err, c.edit)
	}
	require.Equal(t, 3, relayAll(t, freshStore(t, b.db, b.table)))
}

// Issue 47, item 8: the objects the log layout makes beside an outbox
// table (and the sequence of a table of the rows layout) are refused as
// outbox tables: relaying the failed table published its rows. The base
// name is short: the names with suffixes stay within the limit.
func TestSideTablesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	logT, rowsT := dbtest.Table(t), dbtest.Table(t)
	require.NoError(t, freshStore(t, db, logT).CreateLogSchemaIfAbsent(ctx))
	require.NoError(t, freshStore(t, db, rowsT).CreateSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, freshStore(t, db, logT).Add(ctx, tx, events(2)...))
	require.NoError(t, tx.Commit())
	for name, what := range map[string]string{
		logT + "_log": "marker table", logT + "_batch": "batch table", logT + "_settle": "settle table",
		logT + "_failed": "failed table", logT + "_messages": "messages view", logT + "_seq": "sequence",
		logT + "_ord_seq": "ord sequence", logT + "_rows": "rows-layout history",
		logT + "_p00": "partition", logT + "_p15": "partition", logT + "_batch_p0": "batch partition", logT + "_settle_p3": "settle partition",
		rowsT + "_seq": "sequence",
	} {
		s := freshStore(t, db, name)
		_, err := s.Layout(ctx)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
		require.ErrorContains(t, err, "is the "+what+" of ", name)
		require.ErrorContains(t, err, "not an outbox table", name)
		_, err = s.Claim(ctx, 10, time.Minute)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, name)
		require.Error(t, s.CreateLogSchemaIfAbsent(ctx), name)
		t.Logf("%s: %v", name, err)
	}
	// A name with such a suffix whose owner is no outbox table is free.
	free := logT + "x_failed"
	require.NoError(t, freshStore(t, db, free).CreateLogSchemaIfAbsent(ctx))
	t.Cleanup(func() { dropLog(db, free) })
	_, err = freshStore(t, db, free).Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, relayAll(t, freshStore(t, db, logT)), "the outbox itself")
}

// dropLog drops a table of the log layout that dbtest did not name.
func dropLog(db *sql.DB, table string) {
	_, _ = db.Exec(`DROP VIEW IF EXISTS "` + table + `_messages"; DROP TABLE IF EXISTS "` + table + `", "` + table + `_batch", "` + table + `_settle", "` + table + `_failed", "` + table + `_log"`)
}

// Issue 47, item 10: an object of a log table dropped by hand (the claim
// function: SQLSTATE 42883; the settle table: reported as "table does
// not exist") is named, with the advice to apply the schema again, in an
// error wrapping ErrInvalidTable; applying it mends the table.
func TestLogMissingObjectNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, events(2)...)
	for _, c := range []struct {
		drop, says string
		fails      bool // a claim's statement fails
	}{
		{`DROP FUNCTION "{t}_claim"(integer, bigint, bigint, uuid, bigint)`, `its claim function "{t}_claim"(integer, bigint, bigint, uuid, bigint)`, true},
		{`DROP TABLE "{t}_settle" CASCADE`, `lacks its settle table "{t}_settle" (dropped`, true},
		{`DROP TABLE "{t}_failed" CASCADE`, `its failed table "{t}_failed"`, true},
		{`DROP TABLE "{t}_p03"`, `its partition "{t}_p03"`, false},
	} {
		drop, says := strings.ReplaceAll(c.drop, "{t}", b.table), strings.ReplaceAll(c.says, "{t}", b.table)
		_, err := b.db.ExecContext(ctx, drop)
		require.NoError(t, err)
		if c.fails {
			// A store that knew the table: its next statement fails,
			// and the error says why.
			_, err = b.store.Claim(ctx, 1, time.Minute)
			require.ErrorIs(t, err, outbox.ErrInvalidTable, drop)
			require.ErrorContains(t, err, says, drop)
			require.ErrorContains(t, err, "outbox schema --layout log --apply", drop)
			t.Logf("%s: %v", drop, err)
		}
		// A store that reads it afresh.
		l, err := freshStore(t, b.db, b.table).Layout(ctx)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, drop)
		require.ErrorContains(t, err, says, drop)
		require.Equal(t, outbox.LayoutLog, l, "schema --apply may mend it")
		if !c.fails {
			t.Logf("%s: %v", drop, err)
		}

		require.NoError(t, freshStore(t, b.db, b.table).CreateLogSchemaIfAbsent(ctx), drop)
		_, err = b.store.Layout(ctx)
		require.NoError(t, err, drop)
	}
	require.Positive(t, relayAll(t, b.store))
}
