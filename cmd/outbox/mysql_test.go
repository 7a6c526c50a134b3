package main

import (
	"context"
	"database/sql"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// mysqlURL returns the mysql:// URL of a database of the test's own.
func mysqlURL(t *testing.T) (string, *sql.DB) {
	t.Helper()
	dsn := mysqltest.DSN(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	var name string
	require.NoError(t, db.QueryRow("SELECT DATABASE()").Scan(&name))
	return "mysql://root@127.0.0.1:3306/" + name, db
}

// Issue 41: the CLI on MySQL/MariaDB, from a mysql:// URL: `schema`
// prints and applies the table's DDL, `relay` publishes what writers
// commit, and the operator commands see and change the messages.
func TestMySQLCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := mysqlURL(t)
	env := func(k string) string {
		return map[string]string{"DATABASE_URL": url, "AMQP_URL": amqptest.URL()}[k]
	}
	cmd := func(args ...string) (string, int) {
		var out dbtest.Buffer
		code := run(ctx, args, &out, &out, env)
		return out.String(), code
	}
	out, code := cmd("schema")
	require.Zero(t, code, out)
	require.Contains(t, out, "CREATE TABLE IF NOT EXISTS `outbox`")
	out, code = cmd("schema", "--apply")
	require.Zero(t, code, out)
	require.Contains(t, out, "table outbox is ready")
	out, code = cmd("schema", "--ordered")
	require.Zero(t, code, out)
	require.Contains(t, out, "CREATE TRIGGER `outbox_order` BEFORE INSERT ON `outbox`")
	out, code = cmd("schema", "--notify")
	require.Equal(t, 2, code)
	require.Contains(t, out, "LISTEN/NOTIFY is PostgreSQL's")

	store, err := outbox.NewStore(db, &outbox.StoreConfig{MaxAttempts: 1})
	require.NoError(t, err)
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-mysql")
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := store.AddIDs(ctx, tx, outbox.Event{Type: queue}, outbox.Event{Type: queue}, outbox.Event{Type: "parks"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	// The third is parked by hand, as a failed attempt would.
	msgs, err := store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.NoError(t, store.Release(ctx, msgs[:2]...))
	require.NoError(t, store.MarkFailed(ctx, msgs[2], "no route"))

	rctx, cancel := context.WithCancel(ctx)
	var stderr dbtest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"relay", "--poll-interval", "20ms"}, &stderr, &stderr, env)
	}()
	for range 2 {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Ack(false))
			require.Contains(t, ids[:2], d.MessageId)
		case <-time.After(30 * time.Second):
			t.Fatalf("the relay published nothing:\n%s", stderr.String())
		}
	}
	require.Eventually(t, func() bool {
		n, err := store.Pending(ctx)
		require.NoError(t, err)
		return n == 1
	}, 30*time.Second, 20*time.Millisecond, "the two published are marked")
	cancel()
	require.Zero(t, <-done, stderr.String())
	require.Contains(t, stderr.String(), "relay stopped: 2 published")

	out, code = cmd("status")
	require.Zero(t, code, out)
	require.Regexp(t, `parked\s+1`, out)
	out, code = cmd("parked")
	require.Zero(t, code, out)
	require.Contains(t, out, ids[2])
	require.Contains(t, out, "no route")
	out, code = cmd("retry", ids[2])
	require.Zero(t, code, out)
	n, err := store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	msgs, err = store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "retried: claimable again")
	require.NoError(t, store.MarkFailed(ctx, msgs[0], "no route again"))
	out, code = cmd("discard", ids[2])
	require.Zero(t, code, out)
	var purged int
	require.Eventually(t, func() bool { // the discarded one is a millisecond old soon
		out, code = cmd("purge", "--older-than", "1ms")
		require.Zero(t, code, out)
		if m := purgedLine.FindStringSubmatch(out); m != nil {
			n, _ := strconv.Atoi(m[1])
			purged += n
		}
		var left int
		require.NoError(t, db.QueryRow("SELECT count(*) FROM outbox").Scan(&left))
		return left == 0
	}, 10*time.Second, 10*time.Millisecond, "published and discarded messages purged")
	require.Equal(t, 3, purged, out)
}

// Issue 41: both forms of a MySQL connection string are taken, and the
// password of neither is ever printed.
func TestMySQLURLForms(t *testing.T) {
	for _, c := range []struct{ in, dsn, redacted string }{
		{"mysql://app:s3cr%40t@db.internal:3307/shop?tls=true", "app:s3cr@t@tcp(db.internal:3307)/shop?tls=true", "mysql://app:xxxxx@db.internal:3307/shop?tls=true"},
		{"mariadb://app@db/shop", "app@tcp(db:3306)/shop", "mariadb://app@db/shop"},
		{"app:pa:ss@w0rd@tcp(db:3306)/shop?parseTime=true", "app:pa:ss@w0rd@tcp(db:3306)/shop?parseTime=true", "app:xxxxx@tcp(db:3306)/shop?parseTime=true"},
	} {
		dsn, ok, err := mysqlDSN(c.in)
		require.NoError(t, err, c.in)
		require.True(t, ok)
		require.Equal(t, c.dsn, dsn)
		require.Equal(t, c.redacted, redactDSN(c.in))
		require.True(t, looksLikeDSN(c.in))
	}
	_, ok, _ := mysqlDSN("postgres://postgres@127.0.0.1:5432/test")
	require.False(t, ok)
	_, ok, err := mysqlDSN("mysql://app:s3cretpw@db/shop?parseTime=perhaps")
	require.True(t, ok)
	require.Error(t, err)
	require.False(t, strings.Contains(err.Error(), "s3cretpw"), err.Error())
	require.Contains(t, dsnSecrets("app:s3cretpw@tcp(db:3306)/shop"), "s3cretpw")
}

var purgedLine = regexp.MustCompile(`purged (\d+) published message`)

// Issue 41: outbox verify on MariaDB keeps the promise under its faults
// (terminate-db as KILL CONNECTION of the relays' sessions, found by the
// client ports of verify's proxy; close-broker, RabbitMQ closing the
// relays' connections), with the inbox on MariaDB too, and removes its
// scratch tables and those of a run killed before its end.
func TestMySQLVerify(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	url, db := mysqlURL(t)
	// What a run killed before its end left behind: its table and a
	// heartbeat gone stale. This run removes them.
	for _, st := range []string{"CREATE TABLE outbox_verify_0badf00d (seq INT)", "CREATE TABLE outbox_verify_0badf00d_alive (at DATETIME(6) NOT NULL)",
		"INSERT INTO outbox_verify_0badf00d_alive VALUES (UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)"} {
		_, err := db.Exec(st)
		require.NoError(t, err)
	}
	faults := append(slices.Clone(verifyFaults), "terminate-db")
	if _, err := rabbitmqctl(); err == nil {
		faults = append(faults, "close-broker")
	}
	rep, stdout, stderr := runVerifyOn(t, bin, url, "verify", "--duration", "5s", "--rate", "100", "--fault-every", "700ms", "--lease", "1s",
		"--inbox", "--ordered", "--keys", "10", "--json", "--faults", strings.Join(faults, ","))
	require.True(t, rep.OK, "%s\n%s", stdout, stderr)
	require.Contains(t, stderr, "removed what 1 earlier run(s) left behind, killed before they could: outbox_verify_0badf00d")
	require.Equal(t, "rows", rep.Layout)
	require.Zero(t, rep.Lost+rep.Phantom+rep.OrderViolations)
	require.Positive(t, rep.Committed)
	require.Positive(t, rep.RolledBack)
	require.Equal(t, rep.Committed, rep.Inbox.Effects, "every committed event had one effect")
	for _, f := range faults {
		require.Positive(t, rep.Faults[f], "every fault at least once: %v", rep.Faults)
	}
	ended := map[string]int64{}
	for _, e := range rep.FaultLog {
		if e.Ended != nil {
			ended[e.Fault] += *e.Ended
		}
	}
	require.Positive(t, ended["terminate-db"], "terminate-db killed the relays' sessions: %s", stdout)
	require.NotContains(t, stderr, "verify: terminate-db:")
	if slices.Contains(faults, "close-broker") {
		require.Positive(t, ended["close-broker"], "RabbitMQ closed the relays' connections: %s", stdout)
		require.NotContains(t, stderr, "verify: close-broker:")
	}
	var left int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?`, rep.Table+"%").Scan(&left))
	require.Zero(t, left, "the scratch tables are dropped")
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'outbox_verify_0badf00d%'`).Scan(&left))
	require.Zero(t, left, "the killed run's tables are removed")

	code, _, errOut := outboxCmd(t, map[string]string{"DATABASE_URL": url}, "verify", "--layout", "log")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--layout log is PostgreSQL's")
}

// Issue 43 on MariaDB: outbox relay --tables finds the tables of its
// pattern in the connection's database as they are created and lets go
// of one dropped, and outbox status takes the same pattern.
func TestMySQLRelayFindsTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db := mysqlURL(t)
	env := func(k string) string {
		return map[string]string{"DATABASE_URL": url, "AMQP_URL": amqptest.URL()}[k]
	}
	_, queue, deliveries := amqptest.ManualQueue(t, "cli-mysql-find")
	newTable := func(name string) *outbox.Store {
		s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: name})
		require.NoError(t, err)
		require.NoError(t, s.CreateSchemaIfAbsent(ctx))
		return s
	}
	var stderr dbtest.Buffer
	write := func(s *outbox.Store, n int) { t.Helper(); writeEvents(t, db, s, queue, n) }
	received := func(n int, logs *dbtest.Buffer) { t.Helper(); receive(t, deliveries, n, logs) }
	a := newTable("a_outbox")
	write(a, 2)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"relay", "--tables", "*_outbox", "--tables-every", "1s", "--poll-interval", "20ms"}, &stderr, &stderr, env)
	}()
	received(2, &stderr)
	b := newTable("b_outbox")
	write(b, 3)
	received(3, &stderr)
	require.Contains(t, stderr.String(), `msg="relay: Relaying a new table --tables found" table=b_outbox`)
	require.Eventually(t, func() bool { n, err := b.Pending(ctx); return err == nil && n == 0 }, 30*time.Second, 10*time.Millisecond, "marked published")
	_, err := db.ExecContext(ctx, "DROP TABLE b_outbox")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return strings.Contains(stderr.String(), `msg="relay: Let go of a table --tables no longer finds (dropped or renamed)" table=b_outbox`)
	}, 30*time.Second, 10*time.Millisecond, stderr.String())
	write(a, 1)
	received(1, &stderr)
	cancel()
	require.Zero(t, <-done, stderr.String())
	require.Contains(t, stderr.String(), "relay stopped: 6 published")

	var out dbtest.Buffer
	code := run(ctx, []string{"status", "--tables", "*_outbox"}, &out, &out, env)
	require.Zero(t, code, out.String())
	require.Regexp(t, `(?m)^a_outbox\s+0\s`, out.String())
	require.NotContains(t, out.String(), "b_outbox")
}
