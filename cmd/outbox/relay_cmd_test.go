package main

import (
	"context"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// The relay's memory limit holds what its batches may hold at once: the
// batches being published and the one being claimed (twice). Below that,
// a relay of large messages ran its GC back to back (109–128 collections
// for 40 messages of 10 MB, against 5).
func TestRelayMemoryLimitHoldsTheBatchesInFlight(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		batchBytes int64
		inFlight   int
	}{{64 * mib, 4}, {64 * mib, 1}, {mib, 16}, {512 * mib, 8}} {
		live := int64(c.inFlight-1)*c.batchBytes + 2*c.batchBytes
		if got := relayMemoryLimit(c.batchBytes, c.inFlight); got < live+32*mib {
			t.Errorf("relayMemoryLimit(%d, %d) = %d, below the %d its batches may hold, with 32 MiB for the rest", c.batchBytes, c.inFlight, got, live)
		}
	}
	if relayMemoryLimit(64*mib, 8) <= relayMemoryLimit(64*mib, 4) {
		t.Error("the limit does not grow with --max-in-flight")
	}
}

// Issue 38, item 5: every line the relay logs names its table, so that the
// logs of two relays can be told apart; issue 47, item 12: "Batch done"
// counts what the batch published (the messages the settler marked as
// their confirms came included), not 0.
func TestRelayLogLinesNameTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateLogSchemaIfAbsent(ctx))
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-logs")
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: queue}, outbox.Event{Type: queue}, outbox.Event{Type: queue}))
	require.NoError(t, tx.Commit())

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stdout, stderr dbtest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"relay", "--table", table, "--debug"}, &stdout, &stderr, func(k string) string {
			return map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}[k]
		})
	}()
	for range 3 {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Ack(false))
		case <-time.After(30 * time.Second):
			t.Fatalf("the relay published nothing:\n%s", stderr.String())
		}
	}
	published := regexp.MustCompile(`msg="relay: Batch done".* num_published=(\d+)`)
	sum := func() (n int) {
		for _, m := range published.FindAllStringSubmatch(stderr.String(), -1) {
			k, _ := strconv.Atoi(m[1])
			n += k
		}
		return n
	}
	require.Eventually(t, func() bool { return sum() >= 3 }, 30*time.Second, 10*time.Millisecond, "Batch done counts the published messages:\n%s", stderr.String())
	cancel()
	require.Equal(t, 0, <-done, stderr.String())
	require.Equal(t, 3, sum())
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Greater(t, len(lines), 3)
	for _, l := range lines {
		require.Contains(t, l, " table="+table, "every log line names the table")
	}

	code, _, errOut := outboxCmd(t, nil, "relay", "--table", table, "--table", table)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "given twice")
	for _, cmd := range [][]string{{"status"}, {"purge", "--older-than", "1h"}} { // several tables, each once
		code, _, errOut = outboxCmd(t, nil, append(cmd, "--table", "a", "--table", "a")...)
		require.Equal(t, 2, code, "outbox %v", cmd)
		require.Contains(t, errOut, "given twice")
	}
	code, _, errOut = outboxCmd(t, nil, "inbox", "dead", "--consumer", "c", "--table", "a", "--table", "b")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "given twice")
}

// Issue 43: one relay process relays several tables (--table for each),
// of either layout, on one pool and one publisher; its metrics label each
// table's series, and /readyz names a table that fails (dropped under it)
// while the other goes on.
func TestRelayCommandRelaysSeveralTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	var stores []*outbox.Store
	for i, create := range []func(*outbox.Store) func(context.Context) error{
		func(s *outbox.Store) func(context.Context) error { return s.CreateRowsSchemaIfAbsent },
		func(s *outbox.Store) func(context.Context) error { return s.CreateLogSchemaIfAbsent },
	} {
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t) + strconv.Itoa(i)})
		require.NoError(t, err)
		require.NoError(t, create(store)(ctx))
		stores = append(stores, store)
	}
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-tables")
	var stdout, stderr dbtest.Buffer
	write := func(s *outbox.Store, n int) { t.Helper(); writeEvents(t, db, s, queue, n) }
	received := func(n int) { t.Helper(); receive(t, deliveries, n, &stderr) }
	write(stores[0], 5)
	write(stores[1], 7)

	addr := freeAddr(t)
	cancel, done := startRelay(t, &stdout, &stderr, "--table", stores[0].Table(), "--table", stores[1].Table(), "--metrics-addr", addr)
	defer cancel()
	received(12)
	require.Eventually(t, func() bool { code, _ := get(t, "http://"+addr+"/readyz"); return code == http.StatusOK }, 30*time.Second, 10*time.Millisecond, stderr.String())
	// Each table's series, labelled with its name; both drained.
	require.Eventually(t, func() bool {
		_, metrics := get(t, "http://"+addr+"/metrics")
		for _, s := range stores {
			if !regexp.MustCompile(`\noutbox_pending\{[^}]*outbox_table="`+s.Table()+`"\} 0\n`).MatchString(metrics) ||
				!regexp.MustCompile(`\noutbox_messages_claimed_total\{[^}]*outbox_table="`+s.Table()+`"\} \d`).MatchString(metrics) {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "each table's outbox_pending 0 and outbox_messages_claimed_total")
	_, err := db.ExecContext(ctx, `DROP TABLE "`+stores[1].Table()+`" CASCADE`)
	require.NoError(t, err)
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = get(t, "http://"+addr+"/readyz")
		return code == http.StatusServiceUnavailable
	}, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, body, "not ready: "+stores[1].Table()+": failing permanently")
	write(stores[0], 3)
	received(3)
	cancel()
	require.Equal(t, 0, <-done, stderr.String())
	require.Contains(t, stdout.String(), "relay stopped: 15 published")
	require.Contains(t, stderr.String(), `msg="relay: Started" table=`+stores[0].Table())
	require.Contains(t, stderr.String(), `msg="relay: Started" table=`+stores[1].Table())
}

// Issue 43: outbox relay --tables relays every table its pattern finds,
// and those that come to match without a restart: a table created while
// it runs is relayed within a look (--tables-every); one dropped is let
// go (its gauges gone, readiness back) after at most one error of its
// relay, not an error a claim; the other tables go on throughout.
func TestRelayCommandFindsTablesAsTheyComeAndGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	tag := dbtest.TaggedSchemas(t, "a", "b")
	schemaA, schemaB := tag+"_a", tag+"_b"
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-find")
	var stdout, stderr dbtest.Buffer
	write := func(s *outbox.Store, n int) { t.Helper(); writeEvents(t, db, s, queue, n) }
	received := func(n int) { t.Helper(); receive(t, deliveries, n, &stderr) }
	addr := freeAddr(t)
	cancel, done := startRelay(t, &stdout, &stderr, "--tables", tag+"_*.outbox", "--tables-every", "1s", "--metrics-addr", addr)
	defer cancel()
	require.Eventually(t, func() bool {
		code, body := get(t, "http://"+addr+"/readyz")
		return code == http.StatusOK && strings.Contains(body, "no table yet")
	},
		30*time.Second, 10*time.Millisecond, stderr.String())
	require.Contains(t, stderr.String(), `msg="relay: No table matches --tables yet; looking again every --tables-every"`)

	// Tables of either layout appear while it runs.
	a, err := outbox.NewStore(db, &outbox.StoreConfig{Table: schemaA + ".outbox"})
	require.NoError(t, err)
	require.NoError(t, a.CreateLogSchemaIfAbsent(ctx))
	write(a, 3)
	received(3)
	bs, err := outbox.NewStore(db, &outbox.StoreConfig{Table: schemaB + ".outbox"})
	require.NoError(t, err)
	require.NoError(t, bs.CreateRowsSchemaIfAbsent(ctx))
	write(bs, 4)
	received(4)
	for _, s := range []string{schemaA, schemaB} {
		require.Contains(t, stderr.String(), `msg="relay: Relaying a new table --tables found" table=`+s+".outbox")
	}
	series := func(table string) bool { // the table's gauges
		_, metrics := get(t, "http://"+addr+"/metrics")
		return regexp.MustCompile(`\noutbox_pending\{[^}]*outbox_table="` + table + `"`).MatchString(metrics)
	}
	require.Eventually(t, func() bool { return series(schemaA+".outbox") && series(schemaB+".outbox") }, 30*time.Second, 10*time.Millisecond)

	// One is dropped: let go; the other goes on. Its messages are marked
	// first (delivered is not yet marked: a mark on a dropped table is
	// not retried, and the relay would not count them published).
	require.Eventually(t, func() bool { n, err := bs.Pending(ctx); return err == nil && n == 0 }, 30*time.Second, 10*time.Millisecond)
	_, err = db.ExecContext(ctx, `DROP SCHEMA "`+schemaB+`" CASCADE`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return strings.Contains(stderr.String(), `msg="relay: Let go of a table --tables no longer finds (dropped or renamed)" table=`+schemaB+".outbox")
	}, 30*time.Second, 10*time.Millisecond, stderr.String())
	require.False(t, series(schemaB+".outbox"), "the dropped table's gauges are gone")
	require.Eventually(t, func() bool { code, _ := get(t, "http://"+addr+"/readyz"); return code == http.StatusOK }, 30*time.Second, 10*time.Millisecond)
	write(a, 2)
	received(2)
	cancel()
	require.Equal(t, 0, <-done, stderr.String())
	require.Contains(t, stdout.String(), "relay stopped: 9 published")
	var complaints int
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, schemaB+".outbox") && (strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN")) {
			complaints++
		}
	}
	require.LessOrEqual(t, complaints, 4, "the dropped table's relay complained a few times, not at every claim until the next look:\n%s", stderr.String())
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// startRelay runs outbox relay with args on the test database and broker
// until cancel is called; done gives its exit code.
func startRelay(t *testing.T, stdout, stderr *dbtest.Buffer, args ...string) (cancel context.CancelFunc, done <-chan int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	codes := make(chan int, 1)
	go func() {
		codes <- run(ctx, append([]string{"relay"}, args...), stdout, stderr, func(k string) string {
			return map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}[k]
		})
	}()
	return cancel, codes
}

// Issue 43: `outbox relay --notify` of several tables listens for all of
// them on one connection, and each table's commits wake its relay: with
// --poll-interval at an hour, rows written by plain SQL (no Store.Add in
// this process to wake the relay) are published only when a notification
// wakes their table's relay.
func TestRelayNotifyListensOnOneConnection(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	var tables []string
	for i := range 3 {
		table := dbtest.Table(t) + strconv.Itoa(i)
		code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--layout", "rows", "--notify", "--apply")
		require.Equal(t, 0, code, errOut)
		tables = append(tables, table)
	}
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-notify")
	app := "listen_" + tables[0]
	var stdout, stderr dbtest.Buffer
	args := []string{"--poll-interval", "1h", "--notify", "--listen-database-url", dbtest.URLWith(t, "application_name", app)}
	for _, table := range tables {
		args = append(args, "--table", table)
	}
	cancel, done := startRelay(t, &stdout, &stderr, args...)
	defer cancel()
	require.Eventually(t, func() bool { return strings.Count(stderr.String(), `msg="relay: Started"`) == len(tables) }, 20*time.Second, 10*time.Millisecond)
	for i, table := range tables {
		_, err := db.Exec(`INSERT INTO "`+table+`" (id, event_type, routing_key, payload) VALUES (gen_random_uuid(), $1, $1, '{}')`, queue)
		require.NoError(t, err)
		receive(t, deliveries, 1, &stderr)
		t.Logf("table %d woken and published", i)
	}
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app),
		"one listening connection for the three tables")
	require.NotContains(t, stderr.String(), "LISTEN does not work")
	cancel()
	require.Equal(t, 0, <-done, stderr.String())
	require.Contains(t, stdout.String(), "relay stopped: 3 published")
}
