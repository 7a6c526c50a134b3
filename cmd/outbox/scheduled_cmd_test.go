package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 42: `outbox status` shows the delayed messages and when the next
// is due; `outbox scheduled` lists them, makes one due now and discards
// another, with dry runs that change nothing; on PostgreSQL and MariaDB.
func TestScheduledCommand(t *testing.T) {
	t.Parallel()
	for _, onMySQL := range []bool{false, true} {
		name := map[bool]string{false: "postgres", true: "mysql"}[onMySQL]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var (
				db    *sql.DB
				table = "outbox"
				vars  map[string]string
			)
			if onMySQL {
				var url string
				url, db = mysqlURL(t)
				vars = map[string]string{"DATABASE_URL": url}
			} else {
				db, table = dbtest.DB(t), dbtest.Table(t)
			}
			store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			require.NoError(t, store.CreateSchemaIfAbsent(ctx))
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			written, err := store.AddIDs(ctx, tx, outbox.Event{Type: "reminder.due", Key: "order-7", NotBefore: time.Now().Add(time.Hour)},
				outbox.Event{Type: "expiry.due", NotBefore: time.Now().Add(2 * time.Hour)})
			require.NoError(t, err)
			require.NoError(t, tx.Commit())

			code, out, errOut := outboxCmd(t, vars, "status", "--table", table)
			require.Equal(t, 0, code, errOut)
			require.Regexp(t, `(?m)^  scheduled\s+2$`, out)
			require.Regexp(t, `(?m)^next due\s+\S+ \(in (59m\d+s|1h0m0s)\)$`, out)
			code, out, errOut = outboxCmd(t, vars, "status", "--table", table, "--json")
			require.Equal(t, 0, code, errOut)
			var st map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &st))
			require.EqualValues(t, 2, st["scheduled"])
			require.EqualValues(t, 2, st["pending"])
			require.NotNil(t, st["next_due"])

			code, out, errOut = outboxCmd(t, vars, "scheduled", "--table", table)
			require.Equal(t, 0, code, errOut)
			require.Regexp(t, written[0]+`\s+reminder\.due\s+order-7\s+\S+\s+(59m\d+s|1h0m0s)`, out)
			require.Contains(t, out, written[1])
			code, out, errOut = outboxCmd(t, vars, "scheduled", "--table", table, "--json")
			require.Equal(t, 0, code, errOut)
			var list []scheduledMessage
			require.NoError(t, json.Unmarshal([]byte(out), &list))
			require.Len(t, list, 2)
			require.Equal(t, written[0], list[0].ID)
			require.WithinDuration(t, time.Now().Add(time.Hour), list[0].NotBefore, time.Minute)

			code, out, errOut = outboxCmd(t, vars, "scheduled", "--table", table, "--publish-now", "--dry-run", written[0])
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "would publish now 1 of the 1 id(s) given")
			code, out, errOut = outboxCmd(t, vars, "scheduled", "--table", table, "--publish-now", written[0])
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "1 delayed message(s) of table "+table+" made due now")
			code, out, errOut = outboxCmd(t, vars, "scheduled", "--table", table, "--discard", written[1], "0190b4a2-7c3e-7000-8000-0000000000ff")
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "1 delayed message(s) of table "+table+" deleted")
			require.Contains(t, out, "1 id(s) were not delayed messages")

			require.NoError(t, store.Maintain(ctx))
			msgs, err := store.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			require.Equal(t, written[0], msgs[0].ID, "the one made due now, moved by Maintain")

			code, _, errOut = outboxCmd(t, vars, "scheduled", "--table", table, "--publish-now", "--discard", written[0])
			require.Equal(t, 2, code)
			require.Contains(t, errOut, "two actions")
			code, _, errOut = outboxCmd(t, vars, "scheduled", "--table", table, written[0])
			require.Equal(t, 2, code)
			require.Contains(t, errOut, "go with --publish-now or --discard")
		})
	}
}
