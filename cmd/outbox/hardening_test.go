package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 13, B4 and B5: no subcommand, help text or error path prints a
// password, whatever form the connection string takes.
func TestNoSecretIsEverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "Sup3r-S3cret-pw"
	table := dbtest.Table(t)
	dbURLs := map[string]string{
		"url userinfo":        "postgres://postgres:" + pw + "@127.0.0.1:1/test?connect_timeout=1",
		"url query":           "postgres://postgres@127.0.0.1:1/test?connect_timeout=1&password=" + pw,
		"keyword/value":       "host=127.0.0.1 port=1 user=postgres password=" + pw + " dbname=test connect_timeout=1",
		"keyword/value quote": "host=127.0.0.1 port=1 user=postgres password='" + pw + "' dbname=test connect_timeout=1",
		"malformed url":       "postgres://postgres:" + pw + "@127.0.0.1:notaport/test",
		"malformed kv":        "host=127.0.0.1 password=" + pw + " port=",
		"kv semicolon":        "host=127.0.0.1 port=1 password=ab;" + pw + " dbname=test connect_timeout=1",
		"kv open quote":       "host=127.0.0.1 port=1 password='ab " + pw + " dbname=test",
		"wrong password":      strings.Replace(dbtest.URL(), "postgres://postgres", "postgres://postgres:"+pw, 1),
		// Issue 47, item 7: the parser quotes the password up to a '/',
		// '#' or '?' ("invalid port \":Sup3r…\" after host"), which the
		// filter of the whole password does not catch; a parameter's name
		// may be percent-encoded, pgx decodes it.
		"url slash":         "postgres://postgres:" + pw + "/tail@127.0.0.1:1/test",
		"url hash":          "postgres://postgres:" + pw + "#tail@127.0.0.1:1/test",
		"url question":      "postgres://postgres:" + pw + "?tail@127.0.0.1:1/test",
		"url encoded param": "postgres://postgres@127.0.0.1:1/test?connect_timeout=1&pass%77ord=" + pw,
		"url bad setting":   "postgres://postgres:" + pw + "@127.0.0.1:1/test?default_query_exec_mode=bogus",
	}
	amqpURLs := map[string]string{
		"amqp userinfo":  "amqp://guest:" + pw + "@127.0.0.1:5672/",
		"amqp malformed": "amqp://guest:" + pw + "@127.0.0.1:port/",
		"amqp slash":     "amqp://guest:" + pw + "/tail@127.0.0.1:5672/",
		"amqp hash":      "amqp://guest:" + pw + "#tail@127.0.0.1:5672/",
		"amqp question":  "amqp://guest:" + pw + "?tail@127.0.0.1:5672/",
		"amqp comma":     "amqp://guest:" + pw + ",tail@127.0.0.1:5672/", // the CLI splits a list of nodes at ','
	}
	commands := [][]string{
		{"relay"}, {"status"}, {"parked"}, {"retry", "--all-parked"}, {"purge", "--older-than", "1h"},
		{"schema", "--apply"}, {"bench", "--messages", "1"}, {"inbox", "purge", "--consumer", "c", "--older-than", "1h"},
	}
	var runs int
	check := func(vars map[string]string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var stdout, stderr bytes.Buffer
		getenv := func(k string) string { return vars[k] }
		run(ctx, append(args, "--table", table), &stdout, &stderr, getenv)
		out := stdout.String() + stderr.String()
		require.NotContains(t, out, pw, "outbox %v with %v printed the password:\n%s", args, vars, out)
		runs++
	}
	for _, cmd := range commands {
		name := cmd[0]
		if name == "bench" {
			cmd = []string{"bench", "--messages", "1"} // bench has no --table; run() adds one: an unknown flag
		}
		for _, u := range dbURLs {
			env := map[string]string{"DATABASE_URL": u, "AMQP_URL": amqpURLs["amqp userinfo"]}
			check(env, cmd...)
			check(env, append(cmd, "--help")...)
			check(env, name, "-h")
			check(env, name, "--no-such-flag")
			check(env, name, "--table") // a flag without its value
			check(nil, append(cmd, "--database-url", u)...)
		}
		for _, a := range amqpURLs {
			check(map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": a}, name, "--help")
			check(map[string]string{"DATABASE_URL": dbtest.URL()}, name, "--amqp-url", a, "--bad-flag")
		}
	}
	// A connection string where a table name or an id goes is not echoed.
	for _, args := range [][]string{
		{"status", "postgres://postgres:" + pw + "@127.0.0.1:1/test"},
		{"retry", "host=127.0.0.1 password=" + pw},
		{"status", "--table", "postgres://postgres:" + pw + "@127.0.0.1:1/test"},
		{"relay", "--table", "postgres://postgres:" + pw + "/tail@127.0.0.1:1/test"},
		{"purge", "--older-than", "1h", "--table=host=h password=" + pw},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, &stdout, &stderr, func(string) string { return "" })
		require.Equal(t, 2, code, "outbox %v", args)
		require.Contains(t, stderr.String(), "looks like a connection string")
		require.NotContains(t, stdout.String()+stderr.String(), pw)
		require.NotContains(t, stdout.String()+stderr.String(), "127.0.0.1", "not echoed at all")
	}
	for what, a := range amqpURLs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, args := range [][]string{{"bench", "--messages", "1"}, {"verify", "--duration", "1s"}} {
			var stdout, stderr bytes.Buffer
			code := run(ctx, append(args, "--amqp-url", a), &stdout, &stderr, func(k string) string {
				if k == "DATABASE_URL" {
					return dbtest.URL()
				}
				return ""
			})
			require.NotZero(t, code, "outbox %v with a refused or malformed AMQP URL", args)
			require.NotContains(t, stdout.String()+stderr.String(), pw)
			if what == "amqp userinfo" {
				require.Contains(t, stderr.String(), "xxxxx", "outbox %v: the URL is shown, redacted:\n%s", args, stderr.String())
			} else {
				require.Contains(t, stderr.String(), "malformed amqp:// URL", "outbox %v: the URL is named, not shown:\n%s", args, stderr.String())
				require.NotContains(t, stderr.String(), "tail")
			}
			if what != "amqp userinfo" {
				require.NotContains(t, stderr.String(), "scratch table", "outbox %v refuses a malformed URL before it creates anything", args)
			}
		}
		cancel()
	}
	t.Logf("%d command lines checked", runs)
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:pw1@h:5432/db":                    "postgres://u:xxxxx@h:5432/db",
		"postgres://u@h/db?sslmode=disable&password=p2": "postgres://u@h/db?sslmode=disable&password=xxxxx",
		"host=h user=u password=p3 dbname=d":            "host=h user=u password=xxxxx dbname=d",
		"host=h password = 'p 4' dbname=d":              "host=h password = xxxxx dbname=d",
		// Issue 18, item 6: the value runs to the next whitespace whatever
		// it holds, and an open quote to the end.
		"host=h password=ab;S3cr3tTail dbname=d":          "host=h password=xxxxx dbname=d",
		"host=h password='ab cd S3cr3tTail dbname=d":      "host=h password=xxxxx",
		"postgres://u@h/db?password=a;b&sslmode=disable":  "postgres://u@h/db?password=xxxxx&sslmode=disable",
		"postgres://u:p5@h:bad/db":                        "a malformed postgres:// URL",
		"postgres://u@h/db?pass%77ord=p7&sslmode=require": "postgres://u@h/db?pass%77ord=xxxxx&sslmode=require",
		"amqp://guest:p6@localhost:5672/":                 "amqp://guest:xxxxx@localhost:5672/",
	} {
		require.Equal(t, want, redactDSN(in), in)
	}
	require.Contains(t, dsnSecrets("host=h password = 'p 4'"), "p 4")
}

// Issue 13, C6: an empty table, a flag after a positional argument and
// arguments a command does not take are errors, never a fallback to the
// default table; destructive commands name the table and count first, and
// --dry-run does nothing.
func TestFlagMisuseIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}))
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 2, time.Minute)
	require.NoError(t, err)
	require.NoError(t, store.MarkPublished(ctx, msgs[0]))
	require.NoError(t, store.MarkFailed(ctx, msgs[1], "parked for the test"))
	_, err = db.ExecContext(ctx, `UPDATE "`+table+`" SET published_at = now() - interval '3 hours' WHERE published_at IS NOT NULL`)
	require.NoError(t, err)

	code, _, errOut := outboxCmd(t, nil, "purge", "--older-than", "1h", "--table", "")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--table is empty")
	code, _, errOut = outboxCmd(t, nil, "status", "--database-url", " ")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--database-url is empty")
	code, _, errOut = outboxCmd(t, nil, "purge", "--older-than", "1h", "mytable", "--table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unexpected argument "mytable"`)
	require.EqualValues(t, 2, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`"`), "nothing purged")

	code, out, errOut := outboxCmd(t, nil, "purge", "--older-than", "1h", "--table", table, "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would purge 1 published message(s) older than 1h0m0s from table "+table)
	require.Contains(t, out, "dry run: nothing deleted")
	require.EqualValues(t, 2, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`"`))

	code, out, errOut = outboxCmd(t, nil, "retry", "--all-parked", "--dry-run", "--table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would re-arm all 1 parked message(s) of table "+table)
	require.Contains(t, out, "dry run")
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`" WHERE parked_at IS NOT NULL`))

	// Flags after the ids are flags, not ids.
	code, out, errOut = outboxCmd(t, nil, "retry", msgs[1].ID, "--table", table)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "re-armed 1 parked message(s) of table "+table)

	code, out, errOut = outboxCmd(t, nil, "purge", "--table", table, "--older-than", "1h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "purging 1 published message(s) older than 1h0m0s from table "+table)
	require.Contains(t, out, "purged 1 published message(s) older than 1h0m0s from table "+table)
}

// Issue 13, D9 and E: clear errors instead of panics, silent defaults and
// advice that does not fit.
func TestUsageIsClear(t *testing.T) {
	t.Parallel()
	code, out, _ := outboxCmd(t, nil, "status", "--help")
	require.Equal(t, 0, code, "help asked for is not an error")
	require.Contains(t, out, "Usage: outbox status [flags]")
	code, out, _ = outboxCmd(t, nil, "help", "retry")
	require.Equal(t, 0, code)
	require.Contains(t, out, "Usage: outbox retry [flags] ID...")
	require.Contains(t, out, "-all-parked")

	// Issue 38, item 6: every command's help names each flag's value
	// with one word (a backquoted phrase in a usage became the value name:
	// "-layout outbox schema"), and says what is true.
	helps := map[string]string{}
	for _, args := range [][]string{{"inbox", "schema"}, {"inbox", "purge"}, {"inbox", "dead"}, {"inbox", "retry"}, {"inbox", "replay"}} {
		code, out, errOut := outboxCmd(t, nil, append(args, "-h")...)
		require.Equal(t, 0, code, errOut)
		helps[strings.Join(args, " ")] = out
	}
	for name := range commands {
		if name == "version" || name == "inbox" {
			continue
		}
		code, out, errOut := outboxCmd(t, nil, name, "-h")
		require.Equal(t, 0, code, errOut)
		helps[name] = out
	}
	flagLine := regexp.MustCompile(`(?m)^  -(\S+)(?: (.*))?$`)
	for name, out := range helps {
		lines := flagLine.FindAllStringSubmatch(out, -1)
		require.NotEmpty(t, lines, "outbox %s -h lists its flags:\n%s", name, out)
		for _, l := range lines {
			require.NotContains(t, l[2], " ", "outbox %s -h: the value of -%s is named with one word: %q", name, l[1], l[0])
		}
	}
	require.Contains(t, helps["verify"], "  -layout string\n")
	require.Contains(t, helps["bench"], "  -layout string\n")
	require.NotContains(t, helps["relay"], "writers must use ordered mode")
	require.Contains(t, helps["relay"], "the table keeps each key's order, whoever writes to it")
	for _, name := range []string{"declare", "inbox replay"} {
		require.NotContains(t, helps[name], "-database-url", "outbox %s does not use the database", name)
	}
	require.Contains(t, helps["status"], "-database-url")
	require.Contains(t, helps["declare"], "  -bind key\n")
	code, _, errOut := outboxCmd(t, nil, "declare", "--database-url", "postgres://x@h/db", "--dry-run")
	require.Equal(t, 2, code, "declare takes no --database-url")
	require.Contains(t, errOut, "flag provided but not defined: -database-url")
	code, out, _ = outboxCmd(t, nil, "inbox", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"outbox inbox replay --from QUEUE.dead"`)

	code, _, errOut = outboxCmd(t, nil, "bench", "--rate", "2000000000")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--rate must be between 0 and 1000000")
	code, _, errOut = outboxCmd(t, nil, "relay", "--batch-size", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--batch-size must be positive")
	code, _, errOut = outboxCmd(t, nil, "relay", "--lease", "5s", "--publish-timeout", "6s")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--publish-timeout (6s) must be shorter than --lease (5s)")
	require.NotContains(t, errOut, "Config.")

	code, _, errOut = outboxCmd(t, map[string]string{"DATABASE_URL": "postgres://u@h:notaport/db"}, "status")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is not a valid PostgreSQL URL")
	require.NotContains(t, errOut, "cannot reach")
	// Issue 47, item 12: a setting of the driver's that does not parse is
	// a mistake in the configuration, not an unreachable server.
	code, _, errOut = outboxCmd(t, map[string]string{"DATABASE_URL": dbtest.URL() + "&default_query_exec_mode=bogus"}, "status")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is not a valid PostgreSQL URL or keyword/value string: an invalid value of default_query_exec_mode")
	require.NotContains(t, errOut, "cannot reach")

	// A table with other columns gets advice, not just "column does not exist".
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	_, err := db.Exec(`CREATE TABLE "` + table + `" (id uuid PRIMARY KEY, published_at timestamptz, parked_at timestamptz)`)
	require.NoError(t, err)
	code, _, errOut = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is not an outbox table of this version")
}

// Issue 47, item 11: values that cannot work are refused with the reason
// (exit 2), before anything is connected or created: --poll-interval 1ns
// made an idle relay claim 2,400 times a second, --rate NaN passed every
// bound of verify and bench, and convert took --lock-timeout -1s as 1ms.
func TestValuesThatCannotWorkAreRefused(t *testing.T) {
	t.Parallel()
	unreachable := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", "AMQP_URL": "amqp://nobody:x@127.0.0.1:1/"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--poll-interval", "1ns"}, "--poll-interval 1ns is too short: at least 1ms. An idle relay claims once per --poll-interval"},
		{[]string{"relay", "--poll-interval", "999us"}, "--poll-interval 999µs is too short"},
		{[]string{"relay", "--poll-interval", "0"}, "--poll-interval must be positive"},
		{[]string{"verify", "--rate", "NaN"}, "--rate NaN is not a number of messages per second: give one above 0 and at most 1000000"},
		{[]string{"verify", "--rate", "Inf"}, "--rate +Inf is not a number of messages per second"},
		{[]string{"verify", "--rate", "-Inf"}, "--rate -Inf is not a number of messages per second"},
		{[]string{"verify", "--rate", "-5"}, "--rate must be above 0 and at most 1000000 messages per second (got -5)"},
		{[]string{"verify", "--rate", "0"}, "--rate must be above 0 and at most 1000000 messages per second (got 0)"},
		{[]string{"bench", "--rate", "NaN"}, "--rate NaN is not a number of messages per second: give one between 0 and 1000000"},
		{[]string{"bench", "--rate", "+Inf"}, "--rate +Inf is not a number"},
		{[]string{"bench", "--rate", "-1"}, "--rate must be between 0 and 1000000 messages per second (got -1)"},
		{[]string{"bench", "--rate", "1e-12"}, "--rate 1e-12 is too slow: at least 0.001 messages per second (one every 16m40s)"},
		{[]string{"verify", "--rate", "0.0009"}, "--rate 0.0009 is too slow"},
		{[]string{"convert", "--to", "ordered", "--lock-timeout", "-1s"}, "--lock-timeout must be at least 1ms (got -1s)"},
		{[]string{"convert", "--to", "log", "--lock-timeout", "0"}, "--lock-timeout must be at least 1ms (got 0s)"},
	} {
		code, out, errOut := outboxCmd(t, unreachable, c.args...)
		require.Equal(t, 2, code, "outbox %v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "outbox %v", c.args)
		require.Contains(t, errOut, "Run \"outbox "+c.args[0]+" --help\" for its flags.")
		require.Empty(t, out)
		require.NotContains(t, errOut, "cannot reach", "refused before connecting")
	}
}

// Issue 47, item 11: the library refuses a conversion's lock timeout under
// a millisecond (it took -1s as 1ms).
func TestConvertRefusesALockTimeoutUnderAMillisecond(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Table: dbtest.Table(t)})
	require.NoError(t, err)
	_, err = store.ConvertToLog(ctx, true, -time.Second)
	require.ErrorContains(t, err, "outbox: ConvertToLog: lockTimeout must be at least 1ms (got -1s)")
	_, err = store.ConvertOrdering(ctx, outbox.OrderedByKey, true, 0)
	require.ErrorContains(t, err, "outbox: ConvertOrdering: lockTimeout must be at least 1ms (got 0s)")
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	require.Equal(t, `evil\x{1b}[31mred`, printable("evil\x1b[31mred", 100))
	require.Equal(t, "line one line two", printable("line one\n\tline two", 100))
	require.Equal(t, "ééé…", printable("éééé", 3), "cut between characters, not inside one")
	require.Equal(t, "a\uFFFDb", printable("a\xffb", 10))
}

// Issue 13, E: --notify on a table without the trigger says so.
func TestRelayNotifyWithoutTriggerWarns(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr dbtest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"relay", "--table", table, "--notify"}, &stdout, &stderr, func(k string) string {
			return map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}[k]
		})
	}()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "relay: Started") }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.Equal(t, 0, <-done)
	require.Contains(t, stderr.String(), "the table has no NOTIFY trigger")
}

// Issue 47, item 12: `discard not-a-uuid` said "discarding 1" before
// refusing; ids are checked first, and retry's too.
func TestDiscardAndRetryCheckIDsFirst(t *testing.T) {
	t.Parallel()
	table := dbtest.Table(t) // never created: nothing is reached
	for _, args := range [][]string{
		{"discard", "not-a-uuid"},
		{"discard", "0195f1d2-7a7e-7c1f-9a40-3f1b2c3d4e5f", "not-a-uuid", "--dry-run"},
		{"retry", "0195f1d2-7a7e-7c1f-9a40-3f1b2c3d4e5f", "not-a-uuid"},
	} {
		code, out, errOut := outboxCmd(t, nil, append(args, "--table", table)...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, `, "not-a-uuid", is not a message id (a UUID`, args)
		require.NotContains(t, errOut, "discarding", args)
		require.NotContains(t, errOut, "does not exist", "refused before the table is read")
		require.Empty(t, out, args)
	}
}

// Issue 47, item 12: purge said "purging 90" then "purged 0" and no more.
// On the log layout a partition in use (here by a transaction that read
// the table and is still open) is skipped after 50ms so that relays and
// writers never wait behind the purge: it says so, and what to do.
func TestPurgeSaysWhyNoneWerePurged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateLogSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for range 90 {
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "e"}))
	}
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 90)
	require.NoError(t, store.MarkPublished(ctx, msgs...))
	// Writers move on two partitions: the first may go.
	_, err = db.ExecContext(ctx, `SELECT setval('"`+table+`_seq"', 2000000)`)
	require.NoError(t, err)

	reader, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer reader.Rollback() //nolint:errcheck
	require.EqualValues(t, 90, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`"`))
	var n int
	require.NoError(t, reader.QueryRowContext(ctx, `SELECT count(*) FROM "`+table+`"`).Scan(&n))

	code, out, errOut := outboxCmd(t, nil, "purge", "--table", table, "--older-than", "1ms")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "purging 90 published message(s)")
	require.Contains(t, out, "purged 0 published message(s)")
	require.Contains(t, out, "90 message(s) counted before were not purged: their partitions were in use")
	require.Contains(t, out, "pg_stat_activity")
	require.Contains(t, out, "Run the purge again once it has ended")

	require.NoError(t, reader.Rollback())
	code, out, errOut = outboxCmd(t, nil, "purge", "--table", table, "--older-than", "1ms")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "purged 90 published message(s)")
	require.NotContains(t, out, "not purged")
}
