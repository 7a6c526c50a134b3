package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 47, items 5, 8 and 10 from the command line: schema --apply and
// relay refuse a log table's side table (schema --apply altered the failed
// table and called it ready, relay published its rows); schema --apply
// makes a deleted marker row again; a dropped settle table is named, not
// reported as the outbox table missing.
func TestSideTablesCmd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	_, err := db.ExecContext(ctx, `INSERT INTO "`+table+`" (id, event_type, payload) VALUES (gen_random_uuid(), 'a', '')`)
	require.NoError(t, err)

	for _, side := range []string{table + "_failed", table + "_settle_p1", table + "_rows"} {
		code, out, errOut := outboxCmd(t, nil, "schema", "--table", side, "--apply")
		require.Equal(t, 1, code, side)
		require.NotContains(t, out, "is ready", side)
		require.Contains(t, errOut, "not an outbox table: name "+table, side)
	}
	var exists bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, table+"_rows").Scan(&exists))
	require.False(t, exists, "nothing created")

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code = run(rctx, []string{"relay", "--table", table + "_failed"}, &stdout, &stderr, func(k string) string {
		return map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}[k]
	})
	require.NoError(t, rctx.Err(), "the relay stopped on its own: %s", stderr.String())
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr.String(), "is the failed table of "+table)
	t.Logf("relay --table %s_failed: %s", table, lastLine(stderr.String()))

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

	// A dropped settle table is named.
	_, err = db.ExecContext(ctx, `DROP TABLE "`+table+`_settle" CASCADE`)
	require.NoError(t, err)
	code, _, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `lacks its settle table "`+table+`_settle"`)
	require.NotContains(t, errOut, "does not exist in this database")
	t.Logf("status after DROP TABLE %s_settle: %s", table, lastLine(errOut))
	code, _, errOut = outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code, errOut)
}

func lastLine(s string) string {
	s = string(bytes.TrimSpace([]byte(s)))
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
