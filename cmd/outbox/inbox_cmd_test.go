package main

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
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
	require.Contains(t, out, "would purge 1 record(s) of consumer billing older than 720h0m0s from table "+table)
	require.Contains(t, out, "dry run: nothing deleted")
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

// Issue 17, item 9: purge on a missing inbox table advises the inbox's
// schema command, and a consumer without records is named, not purged
// silently.
func TestInboxCommandsExplainMissingTableAndConsumer(t *testing.T) {
	t.Parallel()
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "inbox", "purge", "--table", table, "--consumer", "billing", "--older-than", "720h")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "outbox inbox schema --apply --table "+table)
	code, _, errOut = outboxCmd(t, nil, "inbox", "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	for _, args := range [][]string{
		{"purge", "--older-than", "720h"}, {"dead"}, {"retry", "--all"},
	} {
		code, _, errOut = outboxCmd(t, nil, append(append([]string{"inbox"}, args...), "--table", table, "--consumer", "bilin")...)
		require.Equal(t, 1, code, args)
		require.Contains(t, errOut, `consumer "bilin" has no records in table `+table, args)
	}
}

// Issue 17, item 6: a message dead-lettered by a consumer is listed by
// `outbox inbox dead`, made eligible again by `outbox inbox retry`, moved
// back by `outbox inbox replay`, and then applied once.
func TestInboxDeadRetryReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	_, err := db.Exec(`CREATE TABLE "` + table + `_effects" (message_id text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE "` + table + `_effects"`) })
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: table, MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))

	ch, err := amqptest.Conn(t).Channel()
	require.NoError(t, err)
	queue, dlq := amqptest.Name(t, "q"), amqptest.Name(t, "dlq")
	_, err = ch.QueueDeclare(dlq, false, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, false, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_, _ = ch.QueueDelete(dlq, false, false, false)
	})
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	next := func() *amqp.Delivery {
		select {
		case d := <-deliveries:
			return &d
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
			return nil
		}
	}
	broken := true
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if broken {
			return errors.New("the tax service rejects the address")
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`_effects" VALUES ($1)`, d.MessageId)
		return err
	}
	require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: "order-9", Body: []byte("{}")}))
	o, _ := ib.Handle(ctx, next(), handler)
	require.Equal(t, inbox.DeadLettered, o)

	code, out, errOut := outboxCmd(t, nil, "inbox", "dead", "--table", table, "--consumer", "billing")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "order-9")
	require.Contains(t, out, "the tax service rejects the address")
	// Issue 38, item 6: the queue to replay from is named.
	require.Contains(t, out, "then outbox inbox replay --from QUEUE.dead (the dead-letter queue of the queue the consumer consumes, as outbox declare --queue QUEUE names it)")
	code, out, errOut = outboxCmd(t, nil, "inbox", "retry", "--table", table, "--consumer", "billing", "--all", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would make 1 dead-lettered message(s) of consumer billing eligible again")
	require.Contains(t, out, "dry run: nothing changed")
	code, out, errOut = outboxCmd(t, nil, "inbox", "retry", "--table", table, "--consumer", "billing", "order-9", "order-404")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "made 1 dead-lettered message(s) of consumer billing eligible again")
	require.Contains(t, out, "1 id(s) left alone")
	require.Contains(t, out, "now replay them: outbox inbox replay --from QUEUE.dead (")
	require.NotContains(t, out, "<dead-letter queue>")

	env := map[string]string{"AMQP_URL": amqptest.URL()}
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(dlq, false, false, false, false, nil)
		return err == nil && q.Messages == 1
	}, 10*time.Second, 10*time.Millisecond)
	code, out, errOut = outboxCmd(t, env, "inbox", "replay", "--from", dlq, "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would move 1 of the 1 message(s) in "+dlq)
	code, out, errOut = outboxCmd(t, env, "inbox", "replay", "--from", dlq)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "moved 1 message(s) from "+dlq)

	broken = false
	o, err = ib.Handle(ctx, next(), handler)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`_effects"`))
}

// Issue 47, item 12: `inbox dead` trimmed and cut ids, so that they could
// not be copied back into `inbox retry`; it prints them whole, as shell
// words that give back the exact id. `inbox retry --dry-run ID...`
// counted the ids given, not the matching dead records.
func TestInboxDeadAndRetrySayWhatIsThere(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	require.NoError(t, err, "the test reads the printed ids back with bash")
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "inbox", "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	ids := []string{"a", strings.Repeat("long-", 40) + "end", "has space  double ", "tab\there", "-dash", "quote'x", "line\nbreak", "nbsp\u00a0é", `back\slash$HOME`}
	for _, id := range ids {
		_, err := db.Exec(`INSERT INTO "`+table+`" (consumer, message_id, attempts, last_error, dead_at) VALUES ('billing', $1, 5, 'boom', now())`, id)
		require.NoError(t, err)
	}
	_, err = db.Exec(`INSERT INTO "` + table + `" (consumer, message_id, handled_at) VALUES ('billing', 'h', now());
INSERT INTO "` + table + `" (consumer, message_id, attempts, dead_at) VALUES ('shipping', 's', 5, now())`)
	require.NoError(t, err)

	code, out, errOut := outboxCmd(t, nil, "inbox", "dead", "--table", table, "--consumer", "billing")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, ids[1], "a long id whole")
	require.Contains(t, out, "\n-dash ")
	require.Contains(t, out, `'has space  double '`)
	require.Contains(t, out, `$'tab\there'`)
	// Each line's first word, given to a shell, is the id again.
	lines := strings.Split(out, "\n")[1 : len(ids)+1]
	script := ""
	for _, l := range lines {
		script += "set -- " + l + "; printf '%s\\0' \"$1\"\n"
	}
	got, err := exec.Command(bash, "-c", script).Output()
	require.NoError(t, err, script)
	back := strings.Split(strings.TrimSuffix(string(got), "\x00"), "\x00")
	require.ElementsMatch(t, ids, back, script)
	require.Contains(t, out, "-- ID... for some")

	// a is dead; h is handled; nope has no record; s is another
	// consumer's; a is given twice.
	code, out, errOut = outboxCmd(t, nil, "inbox", "retry", "--table", table, "--consumer", "billing", "--dry-run", "a", "h", "nope", "a", "s")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would make 1 dead-lettered message(s) of consumer billing eligible again in table "+table)
	require.Contains(t, out, "3 id(s) would be left alone: no dead-lettered record of this consumer")
	require.Contains(t, out, "dry run: nothing changed")
	code, out, errOut = outboxCmd(t, nil, "inbox", "retry", "--table", table, "--consumer", "billing", "a", "h", "nope", "a", "s", "--", "-dash")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "made 2 dead-lettered message(s) of consumer billing eligible again")
	require.Contains(t, out, "3 id(s) left alone")
}

// shellWord's three forms.
func TestShellWord(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                     "''",
		"0195f1d2-7a7e-7c1f-9a40-3f1b2c3d4e5f": "0195f1d2-7a7e-7c1f-9a40-3f1b2c3d4e5f",
		"a b":                                  "'a b'",
		"it's":                                 `'it'\''s'`,
		"$HOME*":                               "'$HOME*'",
		"a\nb'\\":                              `$'a\nb\'\\'`,
		"\u00a0":                               `$'\xc2\xa0'`,
	} {
		require.Equal(t, want, shellWord(in), "%q", in)
	}
}
