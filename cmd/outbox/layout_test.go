package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// outbox schema creates the log layout unless told otherwise, and
// --apply on a table that exists keeps its layout (what upgrades a table
// of the rows layout).
func TestSchemaDefaultLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	fresh, rows := dbtest.Table(t), dbtest.Table(t)

	code, out, _ := outboxCmd(t, nil, "schema", "--table", fresh)
	require.Equal(t, 0, code)
	require.Contains(t, out, "PARTITION BY LIST", "printed: the log layout")
	code, out, errOut := outboxCmd(t, nil, "schema", "--table", fresh, "--apply")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "is ready")
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: fresh})
	require.NoError(t, err)
	l, err := store.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l)

	code, _, errOut = outboxCmd(t, nil, "schema", "--table", rows, "--layout", "rows", "--apply")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = outboxCmd(t, nil, "schema", "--table", rows, "--apply")
	require.Equal(t, 0, code, "applied again to a table of the rows layout: its own DDL, idempotent: %s", errOut)
	store, err = outbox.NewStore(db, &outbox.StoreConfig{Table: rows})
	require.NoError(t, err)
	l, err = store.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutRows, l)
}

// The operators' commands work on a table of the log layout as on one of
// the rows layout, and schema --apply refuses to mix layouts.
func TestLogLayoutOperatorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)

	code, out, _ := outboxCmd(t, nil, "schema", "--table", table, "--layout", "log")
	require.Equal(t, 0, code)
	require.Contains(t, out, "PARTITION BY LIST")
	code, out, _ = outboxCmd(t, nil, "schema", "--table", table, "--layout", "log", "--apply")
	require.Equal(t, 0, code, out)
	code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--layout", "rows", "--apply")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "exists with the log layout")
	code, _, errOut = outboxCmd(t, nil, "schema", "--table", table, "--layout", "heap")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--layout must be rows or log")
	// A log table of an earlier version: status says how to bring it up to
	// date, and that does it.
	_, err := db.ExecContext(ctx, `UPDATE "`+table+`_log" SET version = 1`)
	require.NoError(t, err)
	code, _, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "outbox schema --layout log --apply")
	code, out, _ = outboxCmd(t, nil, "schema", "--table", table, "--layout", "log", "--apply")
	require.Equal(t, 0, code, out)
	code, out, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "pending")

	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}, outbox.Event{Type: "c"}, outbox.Event{Type: "d"}))
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 3, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 3)
	require.NoError(t, store.MarkFailed(ctx, msgs[0], "exchange \"x\" does not exist"))
	require.NoError(t, store.MarkFailed(ctx, msgs[1], "unroutable"))
	require.NoError(t, store.MarkPublished(ctx, msgs[2]))

	code, out, _ = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code)
	require.Regexp(t, `pending\s+3\n`, out, "parked messages are pending (the store's contract)")
	require.Regexp(t, `ready\s+1\n`, out)
	require.Regexp(t, `parked\s+2\n`, out)

	code, out, _ = outboxCmd(t, nil, "parked", "--table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, msgs[0].ID)
	require.Contains(t, out, `exchange "x" does not exist`)

	code, out, _ = outboxCmd(t, nil, "retry", "--table", table, msgs[0].ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "re-armed 1 parked message(s)")
	code, out, _ = outboxCmd(t, nil, "discard", "--table", table, msgs[1].ID)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "1")

	code, out, _ = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code)
	require.Regexp(t, `pending\s+2\n`, out, "the re-armed one and the one never claimed")
	require.Regexp(t, `parked\s+0\n`, out)

	code, out, _ = outboxCmd(t, nil, "purge", "--table", table, "--older-than", "1h")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "purged 0 published message(s)", "the only partition is the one writers are in")
}

func TestConvertCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}))
	require.NoError(t, tx.Commit())

	code, _, errOut := outboxCmd(t, nil, "convert", "--table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--to must be log, ordered or unordered")
	code, out, _ := outboxCmd(t, nil, "convert", "--table", table, "--to", "log", "--dry-run")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "would rename "+table+" to "+table+"_rows")
	require.Contains(t, out, "copy 2 message(s) to publish")
	l, err := store.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutRows, l)

	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "log")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "converted "+table+" to the log layout")
	fresh, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	l, err = fresh.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutLog, l)
	n, err := fresh.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

// Issue 21, item 1: an operator makes a table ordered or unordered with
// convert --to, after a dry run that changes nothing; schema --ordered
// prints the trigger for migrations.
func TestConvertOrderingCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))

	code, out, _ := outboxCmd(t, nil, "schema", "--table", table, "--ordered")
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TRIGGER "`+table+`_order" BEFORE INSERT`)
	code, out, _ = outboxCmd(t, nil, "schema", "--table", table, "--ordered", "--layout", "log")
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TRIGGER "`+table+`_order" BEFORE INSERT`)
	require.Contains(t, out, "ordered_from = pg_current_snapshot()")

	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "ordered", "--dry-run")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "dry run: "+table+" is an unordered table; the DDL above would make it ordered")
	mode, err := store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, mode, "a dry run changes nothing")

	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "ordered")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "made "+table+" an ordered table")
	mode, err = store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, mode)
	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "ordered")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "is an ordered table already")

	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "unordered")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "made "+table+" an unordered table")
	mode, err = store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, mode)

	// An ordered table of the rows layout becomes an ordered one of the log
	// layout, and a log table is made unordered and ordered the same way.
	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "ordered")
	require.Equal(t, 0, code, out)
	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "log")
	require.Equal(t, 0, code, out)
	logStore, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t), Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	require.NoError(t, logStore.CheckOrdering(ctx), "still ordered")
	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "unordered")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "made "+table+" an unordered table")
	code, out, _ = outboxCmd(t, nil, "convert", "--table", table, "--to", "ordered")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "made "+table+" an ordered table")
	require.NoError(t, logStore.CheckOrdering(ctx))
}
