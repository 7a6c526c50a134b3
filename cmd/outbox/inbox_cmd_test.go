package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 12: `outbox inbox schema` and `outbox inbox purge`.
func TestInboxCommands(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	code, out, _ := outboxCmd(t, nil, "inbox", "schema", "--table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TABLE IF NOT EXISTS "`+table+`"`)
	code, out, errOut := outboxCmd(t, nil, "inbox", "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "table "+table+" is ready")

	_, err := db.Exec(`INSERT INTO "` + table + `" (consumer, message_id, received_at, handled_at) VALUES
		('billing', 'a', now() - interval '40 days', now()), ('billing', 'b', now(), now()), ('shipping', 'a', now() - interval '40 days', now())`)
	require.NoError(t, err)
	code, out, errOut = outboxCmd(t, nil, "inbox", "purge", "--table", table, "--consumer", "billing", "--older-than", "720h", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "purging 1 record(s) of consumer billing older than 720h0m0s from table "+table)
	require.Contains(t, out, "dry run")
	code, out, errOut = outboxCmd(t, nil, "inbox", "purge", "--table", table, "--consumer", "billing", "--older-than", "720h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "purged 1 record(s) of consumer billing")
	require.EqualValues(t, 2, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`"`))

	code, _, errOut = outboxCmd(t, nil, "inbox", "purge", "--table", table, "--older-than", "720h")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--consumer and a positive --older-than are required")
	code, out, _ = outboxCmd(t, nil, "help", "inbox")
	require.Equal(t, 0, code)
	require.Contains(t, out, "outbox inbox schema")

	// The table it prints is the one the package creates.
	ib, err := inbox.New(db, &inbox.Config{Consumer: "c", Table: table})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(context.Background()))
}
