package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 43: the read of a table's ordering mode, which a relay makes
// before its claims, looks up the catalog by index, whatever plan
// PostgreSQL caches for it: scanning pg_depend cost 90ms a read on a
// database of a thousand log tables, and a group of their relays waited
// on it. The generic plan (the one a prepared statement settles on) is
// the one checked. (pg_trigger and pg_attribute may be scanned when they
// are small: what grows with every object is pg_depend.)
func TestReadOrderUsesTheCatalogsIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `PREPARE read_order(text, name, name) AS `+outbox.ReadOrderSQL)
	require.NoError(t, err)
	defer conn.ExecContext(ctx, `DEALLOCATE read_order`) //nolint:errcheck
	rows, err := conn.QueryContext(ctx, `EXPLAIN EXECUTE read_order('some_table', 'some_trigger', 'seq')`)
	require.NoError(t, err)
	var plan string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan += line + "\n"
	}
	require.NoError(t, rows.Err())
	// pg_depend holds an entry for every object of the database (some
	// thousands in an empty one): the look is by its reference index.
	require.Contains(t, plan, "pg_depend_reference_index", plan)
	require.NotContains(t, plan, "Seq Scan on pg_depend", plan)
}
