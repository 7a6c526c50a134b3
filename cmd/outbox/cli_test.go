package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// outboxCmd runs the CLI in-process with DATABASE_URL pointing at the test
// database and returns its exit code, stdout and stderr.
func outboxCmd(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		if k == "DATABASE_URL" {
			return dbtest.URL()
		}
		return ""
	}
	code := run(context.Background(), args, &stdout, &stderr, getenv)
	return code, stdout.String(), stderr.String()
}

func TestSchema(t *testing.T) {
	t.Parallel()
	table := dbtest.Table(t)
	code, out, _ := outboxCmd(t, nil, "schema", "--table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TABLE IF NOT EXISTS "`+table+`"`)
	require.NotContains(t, out, "pg_notify")

	code, out, _ = outboxCmd(t, nil, "schema", "--table", table, "--notify")
	require.Equal(t, 0, code)
	require.Contains(t, out, "pg_notify('outbox:"+table+"'")

	code, out, _ = outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code)
	require.Contains(t, out, "table "+table+" is ready")
	require.Zero(t, dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM "`+table+`"`))

	code, _, errOut := outboxCmd(t, nil, "schema", "--table", "x; DROP TABLE y")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "invalid table name")
}

func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}, outbox.Event{Type: "c"}, outbox.Event{Type: "d"}))
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 3, time.Minute)
	require.NoError(t, err)
	require.NoError(t, store.MarkFailed(ctx, msgs[0], "exchange \"x\" does not exist"))
	require.NoError(t, store.MarkFailed(ctx, msgs[1], "unroutable"))
	require.NoError(t, store.MarkPublished(ctx, msgs[2]))
	_, err = db.ExecContext(ctx, `UPDATE "`+table+`" SET published_at = now() - interval '3 hours' WHERE published_at IS NOT NULL`)
	require.NoError(t, err)

	code, out, _ := outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code)
	// Issue 38, item 1: pending is every message not yet published,
	// parked ones included; ready is what should be moving.
	require.Regexp(t, `pending\s+3\n`, out, "d ready, a and b parked: all pending")
	require.Regexp(t, `ready\s+1\n`, out)
	require.Regexp(t, `in flight\s+0\n`, out)
	require.Regexp(t, `parked\s+2\n`, out)
	require.Contains(t, out, "outbox parked --table "+table)

	code, out, _ = outboxCmd(t, nil, "parked", "--table", table)
	require.Equal(t, 0, code)
	require.Contains(t, out, msgs[0].ID)
	require.Contains(t, out, msgs[1].ID)
	require.Contains(t, out, `exchange "x" does not exist`)

	code, out, _ = outboxCmd(t, nil, "retry", "--table", table, msgs[0].ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "re-armed 1 parked message(s)")
	code, out, _ = outboxCmd(t, nil, "retry", "--table", table, "--all-parked")
	require.Equal(t, 0, code)
	require.Contains(t, out, "re-armed 1 parked message(s)")
	code, _, _ = outboxCmd(t, nil, "retry", "--table", table)
	require.Equal(t, 2, code, "neither ids nor --all-parked")

	code, out, _ = outboxCmd(t, nil, "purge", "--table", table, "--older-than", "1h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "purged 1 published message(s)")
	require.EqualValues(t, 3, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`"`))
	code, _, errOut := outboxCmd(t, nil, "purge", "--table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--older-than is required")
}

func TestErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	code, _, errOut := outboxCmd(t, nil, "status", "--table", "no_such_outbox_table")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `table "no_such_outbox_table" does not exist`)
	require.Contains(t, errOut, "outbox schema --apply --table no_such_outbox_table")

	code, _, errOut = outboxCmd(t, map[string]string{"DATABASE_URL": ""}, "status")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "set DATABASE_URL or pass --database-url")

	code, _, errOut = outboxCmd(t, map[string]string{"DATABASE_URL": "postgres://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2"}, "status")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot reach PostgreSQL at postgres://postgres:xxxxx@127.0.0.1:1/test")
	require.NotContains(t, errOut, "s3cret")

	code, out, _ := outboxCmd(t, nil)
	require.Equal(t, 2, code)
	require.Contains(t, out, "Usage:")
	code, _, errOut = outboxCmd(t, nil, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)
}

// TestRelayDaemon builds the command, runs `outbox relay` as its own
// process, and stops it with SIGTERM.
// TestOrderedOperatorCommands: a key blocked by its parked first message
// shows in status and parked, and discard unblocks it, keeping the record.
func TestOrderedOperatorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1, Ordering: outbox.OrderedByKey, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.placed", Key: "order-7"}, outbox.Event{Type: "order.shipped", Key: "order-7"}, outbox.Event{Type: "free"}))
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 3)
	require.NoError(t, store.MarkFailed(ctx, msgs[0], "NO_ROUTE"))
	require.NoError(t, store.MarkFailed(ctx, msgs[2], "NO_ROUTE"))
	require.NoError(t, store.Release(ctx, msgs[1]))

	code, out, _ := outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code)
	require.Regexp(t, `blocked keys\s+1\n`, out)
	require.Regexp(t, `held\s+1\n`, out, "order.shipped")
	require.Contains(t, out, "in ordered mode, a key with a parked message is blocked")
	code, out, _ = outboxCmd(t, nil, "parked", "--table", table)
	require.Equal(t, 0, code)
	require.Regexp(t, `ID\s+EVENT TYPE\s+BLOCKED KEY\s+ATTEMPTS`, out)
	require.Regexp(t, msgs[0].ID+`\s+order.placed\s+order-7\s+1\s`, out)
	require.Regexp(t, msgs[2].ID+`\s+free\s+-\s+1\s`, out, "a message without a key blocks nothing")
	require.Contains(t, out, "outbox discard --table "+table+" ID...")

	claimed, err := store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, claimed, "order.shipped waits behind the parked order.placed")
	code, out, _ = outboxCmd(t, nil, "discard", "--table", table, msgs[0].ID, msgs[1].ID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "discarded 1 parked message(s) of table "+table)
	require.Contains(t, out, "1 id(s) were not parked messages")
	claimed, err = store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, "order.shipped", claimed[0].EventType)
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`" WHERE discarded_at IS NOT NULL AND last_error = 'NO_ROUTE'`))
	code, out, _ = outboxCmd(t, nil, "status", "--table", table)
	require.Equal(t, 0, code)
	require.Regexp(t, `blocked keys\s+0\n`, out)

	code, _, errOut := outboxCmd(t, nil, "discard", "--table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "give the ids of the parked messages")
	code, _, errOut = outboxCmd(t, nil, "discard", "--table", table, "nope")
	require.Equal(t, 2, code, "a usage error, found before anything is read (issue 47, item 12)")
	require.Contains(t, errOut, `"nope", is not a message id`)
}

func TestRelayDaemon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "outbox")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	order := amqptest.NewOrderLog()
	consumer := amqptest.ConsumeFunc(t, conn, top.Queue, order.Record)
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange(top.Exchange), Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	write := func(n int) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		evts := make([]outbox.Event, n)
		for i := range evts {
			evts[i] = outbox.Event{Type: "order.placed", Key: fmt.Sprint("order-", i%7)}
		}
		require.NoError(t, store.Add(ctx, tx, evts...))
		require.NoError(t, tx.Commit())
	}
	write(300)

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "relay", "--table", table, "--poll-interval", "20ms", "--ordered")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	require.Eventually(t, func() bool { return consumer.Distinct() == 300 }, 30*time.Second, 10*time.Millisecond)
	write(200)
	require.Eventually(t, func() bool { return consumer.Distinct() == 500 }, 30*time.Second, 10*time.Millisecond)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit 0 on SIGTERM; stderr:\n%s", stderr.String())
	require.Contains(t, stdout.String(), "relay stopped: 500 published")
	require.Contains(t, stderr.String(), "relay: Stopped")
	require.Contains(t, stderr.String(), "ordered=true")
	got := order.Keys()
	for key, ids := range dbtest.IDsByKey(t, db, `"`+table+`"`) {
		require.Equal(t, ids, got[key], "key %s in the order of writing", key)
	}
	require.NotContains(t, stderr.String(), "guest:guest", "no credentials in logs")
	require.Zero(t, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`" WHERE published_at IS NULL OR claim_token IS NOT NULL`))
	require.False(t, strings.Contains(stderr.String(), "level=ERROR"), stderr.String())
}

func TestBench(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"AMQP_URL": amqptest.URL()}
	code, out, errOut := outboxCmd(t, vars, "bench", "--messages", "400", "--batch-size", "50", "--runs", "2")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `bench: \d+ cores, go\S+, PostgreSQL \d+.*RabbitMQ \d+\.\d+\.\d+; log layout; 256-byte persistent messages, durable queue`, out)
	require.Regexp(t, `broker alone \(amqp091-go, confirms pipelined, window 1000\): \d+ \[\d+–\d+\] msgs/s; again after the relay: \d+ \[\d+–\d+\] msgs/s`, out)
	require.Regexp(t, `relay, 400 messages written first over a key of its own for each; \d+ \[\d+–\d+\] msgs/s = \d+\.\d+ × the broker alone; 0 first deliveries out of their key's order`, out)
	require.Regexp(t, `each run's relay against the broker alone just before and just after it: \d+\.\d\d/\d+\.\d\d, \d+\.\d\d/\d+\.\d\d\n`, out, "two runs")
	require.Regexp(t, `broker alone publishing what the relay publishes \(a key header, type, timestamp\): \d+ \[\d+–\d+\] msgs/s; the relay = \d+\.\d+ × that`, out)
	require.Regexp(t, `the same as the relay publishes them, on 4 connections at once \(one per batch in flight\), 50 messages per write: \d+ \[\d+–\d+\] msgs/s; the relay = \d+\.\d+ × that`, out)
	require.Regexp(t, `as the relay publishes them: \d+\), relay \d+ msgs/s`, errOut)
	require.Regexp(t, `relay \d+ msgs/s, broker alone again \d+ msgs/s: the relay = \d+\.\d\d × the broker alone before it, \d+\.\d\d × after, \d+\.\d\d × as the relay publishes; the server flushed its WAL \d+ times while the relay ran`, errOut, "PostgreSQL 14 and later tell")
	require.Regexp(t, `relay: \d+ batches of \S+ messages on average; claim p50 \S+ ms, p99 \S+ ms, max \S+ ms; publish with confirms p50 \S+ ms, p99 \S+ ms, max \S+ ms`, errOut)
	code, out, errOut = outboxCmd(t, vars, "bench", "--messages", "300", "--keys", "3", "--ordered", "--runs", "1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `relay in ordered mode, same messages: \d+ \[\d+–\d+\] msgs/s = \d+\.\d+ × unordered, \d+\.\d+ × the broker alone; 0 first deliveries out of their key's order`, out)
	code, out, errOut = outboxCmd(t, vars, "bench", "--claims", "--published", "1000", "--pending", "2500", "--batch-size", "10", "--keys", "100", "--blocked", "300")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `unordered: no history \S+ ms \[\S+\]; 1000 published rows \S+ ms \[\S+\]; ratio \d+\.\d+`, out)
	require.Regexp(t, `ordered by key: no history \S+ ms \[\S+\]; 1000 published rows \S+ ms \[\S+\]; ratio \d+\.\d+`, out)
	require.Regexp(t, `one key blocked with 300 messages behind it: claims \S+ ms \[\S+\] before they are set aside; Reconcile set 300 aside in \d+ ms; then \S+ ms`, out)
	code, out, errOut = outboxCmd(t, vars, "bench", "--messages", "100", "--rate", "200", "--writers", "2", "--runs", "1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `commit to consume at 200 msgs/s, 2 writer\(s\), one message per transaction, relay in the bench's process: p50 \S+ ms \[\S+\], p90 \S+ ms \[\S+\], p99 \S+ ms \[\S+\], max \S+ ms \[\S+\]; p50 of the first fifth \S+ ms \[\S+\], of the last fifth \S+ ms`, out)
	require.Regexp(t, `the floor, the same writers publishing each message themselves right after its commit \(no relay, no guarantee\): p50 \S+ ms \[\S+\], p90 \S+ ms \[\S+\], p99 \S+ ms \[\S+\], max \S+ ms \[\S+\]; p50 of the first fifth`, out)
	require.Regexp(t, `publishing directly after each commit: p50 \S+ms p99 \S+ms`, errOut)
	m := regexp.MustCompile(`scratch table (outbox_bench_[0-9a-f]+)`).FindStringSubmatch(errOut)
	code, out2, errOut2 := outboxCmd(t, vars, "bench", "--messages", "100", "--rate", "200", "--runs", "1", "--hold-snapshot", "--floor=false")
	require.Equal(t, 0, code, errOut2)
	require.NotContains(t, out2+errOut2, "directly", "--floor=false measures no floor")
	require.Contains(t, errOut2, "holding a REPEATABLE READ snapshot open until the end")
	require.Regexp(t, `-?\d+ dead row versions left by the run`, errOut2)
	// In ordered mode, on either layout (the table is made ordered: a
	// relay in ordered mode refuses one that is not).
	for _, layout := range []string{"rows", "log"} {
		code, out, errOut3 := outboxCmd(t, vars, "bench", "--messages", "100", "--rate", "200", "--runs", "1", "--ordered", "--layout", layout)
		require.Equal(t, 0, code, errOut3)
		require.Contains(t, out, "commit to consume at 200 msgs/s", layout)
	}
	require.NotNil(t, m, errOut)
	require.Zero(t, dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM pg_tables WHERE tablename = $1`, m[1]), "the scratch table is dropped")
	code, _, errOut = outboxCmd(t, vars, "bench", "--ack-every", "500", "--prefetch", "100")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "must not exceed --prefetch")
}

// TestRelayDaemonReleasesOnSIGTERM stops `outbox relay` while it holds
// claims it cannot publish (the broker stopped answering): it must exit 0
// and leave no claim behind, so that another relay can take the messages at
// once rather than after the lease.
func TestRelayDaemonReleasesOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}, outbox.Event{Type: "c"}))
	require.NoError(t, tx.Commit())

	proxy := amqptest.NewProxy(t)
	proxy.Stall() // the broker accepts the connection and then never answers

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "relay", "--table", table, "--lease", "1h", "--publish-timeout", "50m", "--shutdown-timeout", "300ms")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+proxy.URL())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	require.Eventually(t, func() bool {
		return dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`" WHERE claimed_until > now() + interval '50 minutes'`) == 3
	}, 30*time.Second, 10*time.Millisecond, "the relay claims the batch for an hour")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit 0 on SIGTERM; stderr:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("relay did not exit within 30s of SIGTERM; stderr:\n%s", stderr.String())
	}
	// 3 released, or a multiple: a relay that started while its publisher
	// was still dialing may have had a publish refused (broker
	// unreachable) and released the batch before it claimed it again.
	require.Regexp(t, `0 published, 0 failed, (3|6|9|12) released, 0 leases lost`, stdout.String(), stderr.String())
	require.Zero(t, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`" WHERE claim_token IS NOT NULL OR attempts > 0 OR published_at IS NOT NULL`),
		"released at once, without an attempt")
}
