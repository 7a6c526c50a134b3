package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// writeEvents commits n events of type typ to s, in one transaction.
func writeEvents(t *testing.T, db *sql.DB, s *outbox.Store, typ string, n int) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for range n {
		require.NoError(t, s.Add(ctx, tx, outbox.Event{Type: typ}))
	}
	require.NoError(t, tx.Commit())
}

// receive acks n deliveries, and fails the test, showing logs, when one
// does not come within 30s.
func receive(t *testing.T, deliveries <-chan amqp.Delivery, n int, logs fmt.Stringer) {
	t.Helper()
	for range n {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Ack(false))
		case <-time.After(30 * time.Second):
			t.Fatalf("the relay published too little:\n%s", logs)
		}
	}
}

// parkOne writes an event to s and parks it, as a failed attempt would;
// it returns its id.
func parkOne(t *testing.T, db *sql.DB, s *outbox.Store, why string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := s.AddIDs(ctx, tx, outbox.Event{Type: "parks"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	msgs, err := s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, s.MarkFailed(ctx, msgs[0], why))
	return ids[0]
}

// Issue 43: the operator commands take the relay's selection of tables
// (--table once for each, --tables a pattern): status prints a line a
// table (a JSON array with --json), parked lists each table's parked
// messages under its name (each with its table in JSON), retry and
// discard act on the id wherever it is parked, purge purges each table;
// a table that fails is named and the others are done.
func TestOperatorCommandsOnSeveralTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	tag := dbtest.TaggedSchemas(t, "a", "b")
	var stores []*outbox.Store
	for i, s := range []string{tag + "_a", tag + "_b"} {
		st, err := outbox.NewStore(db, &outbox.StoreConfig{Table: s + ".outbox", MaxAttempts: 1})
		require.NoError(t, err)
		create := st.CreateLogSchemaIfAbsent
		if i == 1 {
			create = st.CreateRowsSchemaIfAbsent
		}
		require.NoError(t, create(ctx))
		stores = append(stores, st)
	}
	a, bt := stores[0].Table(), stores[1].Table()
	idA := parkOne(t, db, stores[0], "no route to a")
	idB := parkOne(t, db, stores[1], "no route to b")
	parkOne(t, db, stores[1], "another")
	env := map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}
	pattern := tag + "_*.outbox"

	code, out, errOut := outboxCmd(t, env, "status", "--tables", pattern)
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^TABLE\s+PENDING\s+READY`, out)
	require.Regexp(t, `(?m)^`+a+`\s+1\s+0\s+0\s+0\s+0\s+1\s`, out, "a line a table: pending 1, parked 1")
	require.Regexp(t, `(?m)^`+bt+`\s+2\s+0\s+0\s+0\s+0\s+2\s`, out)
	require.Contains(t, out, "2 table(s) have parked messages")
	code, out, errOut = outboxCmd(t, env, "status", "--table", bt, "--table", a, "--json")
	require.Zero(t, code, errOut)
	var docs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &docs))
	require.Len(t, docs, 2)
	require.Equal(t, bt, docs[0]["table"], "in the order given")
	require.EqualValues(t, 2, docs[0]["parked"])

	code, out, errOut = outboxCmd(t, env, "parked", "--tables", pattern)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "== table "+a+": 1 parked message(s)")
	require.Contains(t, out, "== table "+bt+": 2 parked message(s)")
	require.Contains(t, out, idA)
	require.Contains(t, out, "no route to b")
	code, out, errOut = outboxCmd(t, env, "parked", "--tables", pattern, "--json")
	require.Zero(t, code, errOut)
	var msgs []struct{ Table, ID string }
	require.NoError(t, json.Unmarshal([]byte(out), &msgs))
	require.Len(t, msgs, 3)
	for _, m := range msgs {
		require.Equal(t, map[bool]string{true: a, false: bt}[m.ID == idA], m.Table)
	}

	code, out, errOut = outboxCmd(t, env, "retry", "--tables", pattern, idA, idB)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "re-armed 1 parked message(s) of table "+a)
	require.Contains(t, out, "re-armed 1 parked message(s) of table "+bt)
	require.NotContains(t, out, "left alone")
	for i, s := range stores {
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, []int64{0, 1}[i], st.Parked, s.Table())
	}
	code, out, errOut = outboxCmd(t, env, "discard", "--tables", pattern, "--dry-run", idA)
	require.Zero(t, code, errOut)
	require.Contains(t, out, "dry run: nothing discarded")
	require.NotContains(t, out, "would discard 1", "no longer parked")
	code, out, errOut = outboxCmd(t, env, "purge", "--tables", pattern, "--older-than", "1h", "--dry-run")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "from table "+a)
	require.Contains(t, out, "from table "+bt)

	// A table that fails is named; the others are done.
	code, out, errOut = outboxCmd(t, env, "status", "--table", a, "--table", tag+"_c.outbox")
	require.Equal(t, 1, code)
	require.Regexp(t, `(?m)^`+a+`\s+1\s+1\s`, out, "pending 1, ready 1: re-armed")
	require.Contains(t, errOut, "table "+tag+"_c.outbox: ")
	require.Contains(t, errOut, "1 of the 2 tables failed")
	code, _, errOut = outboxCmd(t, env, "status", "--tables", tag+"_c*.outbox")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no outbox table matches --tables "+tag+"_c*.outbox")
	code, _, errOut = outboxCmd(t, env, "status", "--tables", "Tenant_*")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--tables: pattern "Tenant_*": character 'T' is not allowed`)
}
