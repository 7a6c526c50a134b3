package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 47, item 5 from the command line: schema --apply makes a deleted
// marker row again (it refused the table).
func TestSideTablesCmd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	_, err := db.ExecContext(ctx, `INSERT INTO "`+table+`" (id, event_type, payload) VALUES (gen_random_uuid(), 'a', '')`)
	require.NoError(t, err)

	// A deleted marker row: refused, and made again by schema --apply.
	_, err = db.ExecContext(ctx, `DELETE FROM "`+table+`_log"`)
	require.NoError(t, err)
	code, _, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "marker row is missing")
	code, out, errOut := outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "is ready")
	code, out, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "pending")
}
