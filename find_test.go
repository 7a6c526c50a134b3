package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// TestFindTablesFindsOutboxTablesOnly proves that FindTables, on
// PostgreSQL, returns the outbox tables of both layouts whose names match
// (schema and table parts, * and ?), qualified as the pattern is, and
// none of what lies beside them: the log layout's partitions and side
// tables, the history a conversion keeps (a rows-layout table beside a
// log table), plain tables; that _ in a pattern is literal (it is a
// wildcard of LIKE); and that a pattern that is not one is refused.
func TestFindTablesFindsOutboxTablesOnly(t *testing.T) {
	ctx := context.Background()
	db := dbtest.DB(t)
	tag := dbtest.TaggedSchemas(t, "a", "b")
	a, other := tag+"_a", tag+"_b"
	create := func(name string, log bool) {
		t.Helper()
		s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: name})
		require.NoError(t, err)
		if log {
			require.NoError(t, s.CreateLogSchemaIfAbsent(ctx))
		} else {
			require.NoError(t, s.CreateRowsSchemaIfAbsent(ctx))
		}
	}
	create(a+".outbox", true)
	create(a+".orders_outbox", false)
	create(a+".ordersxoutbox", false)
	create(a+".conv", true)
	history, err := outbox.RowsSchema(a + ".conv_rows") // what a conversion to the log layout keeps of the rows table
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, history)
	require.NoError(t, err)
	create(other+".outbox", false)
	_, err = db.ExecContext(ctx, `CREATE TABLE "`+a+`".plain (id int, published_at timestamptz, payload bytea);
CREATE TABLE "`+a+`".plain_outbox (id int)`)
	require.NoError(t, err)

	find := func(db *sql.DB, pattern string) []string {
		t.Helper()
		got, err := outbox.FindTables(ctx, db, pattern)
		require.NoError(t, err, pattern)
		return got
	}
	require.Equal(t, []string{a + ".conv", a + ".orders_outbox", a + ".ordersxoutbox", a + ".outbox"}, find(db, a+".*"),
		"partitions, the marker, batch, settle and failed tables, the scheduled table, the conversion's history and tables without the columns are left out")
	require.Equal(t, []string{a + ".outbox", other + ".outbox"}, find(db, tag+"_*.outbox"), "the table of every schema that matches")
	require.Equal(t, []string{a + ".orders_outbox"}, find(db, a+".orders_outbox"), "_ is literal")
	require.Equal(t, []string{a + ".orders_outbox", a + ".ordersxoutbox"}, find(db, a+".orders?outbox"))
	require.Empty(t, find(db, tag+"_c.*"), "no schema matches: no table, no error")

	sdb, err := sql.Open("pgx", dbtest.URLWith(t, "search_path", a))
	require.NoError(t, err)
	t.Cleanup(func() { sdb.Close() })
	require.Equal(t, []string{"orders_outbox", "ordersxoutbox", "outbox"}, find(sdb, "*outbox"), "unqualified: the current schema, names unqualified")

	for _, bad := range []string{"", "a.b.c", "Tenant_*.outbox", "x;drop", ".outbox", "tenant_[a].outbox"} {
		_, err := outbox.FindTables(ctx, db, bad)
		require.ErrorContains(t, err, "FindTables", bad)
	}
	_, err = outbox.FindTables(ctx, nil, "*")
	require.ErrorIs(t, err, outbox.ErrNoPool)
}

// TestMySQLFindTables proves FindTables on MariaDB: the outbox tables of
// the connection's database (or of the databases a qualified pattern
// names), not the tables the store keeps beside them (its delayed
// messages) nor other tables.
func TestMySQLFindTables(t *testing.T) {
	ctx := context.Background()
	db := mysqltest.DB(t)
	for _, name := range []string{"outbox", "orders_outbox", "ordersxoutbox"} {
		s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: name})
		require.NoError(t, err)
		require.NoError(t, s.CreateSchemaIfAbsent(ctx))
	}
	_, err := db.ExecContext(ctx, "CREATE TABLE plain_outbox (id int)")
	require.NoError(t, err)
	var schema string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema))

	got, err := outbox.FindTables(ctx, db, "*")
	require.NoError(t, err)
	require.Equal(t, []string{"orders_outbox", "ordersxoutbox", "outbox"}, got)
	got, err = outbox.FindTables(ctx, db, "orders_outbox")
	require.NoError(t, err)
	require.Equal(t, []string{"orders_outbox"}, got, "_ is literal")
	got, err = outbox.FindTables(ctx, db, schema[:len(schema)-2]+"??.*outbox")
	require.NoError(t, err)
	require.Equal(t, []string{schema + ".orders_outbox", schema + ".ordersxoutbox", schema + ".outbox"}, got, "qualified: the databases that match")
}
