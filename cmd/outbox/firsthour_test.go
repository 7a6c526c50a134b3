package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 18, item 5: a lease too short to work is refused, with the reason,
// and CLI errors name flags, not Go fields.
func TestLeaseTooShortRefused(t *testing.T) {
	t.Parallel()
	for _, lease := range []string{"90ms", "1ms", "2ns"} {
		code, _, errOut := outboxCmd(t, nil, "relay", "--lease", lease)
		require.Equal(t, 2, code, lease)
		require.Contains(t, errOut, "--lease "+lease+" is too short: at least 1s", lease)
		require.NotContains(t, errOut, "Config.")
	}
	code, out, _ := outboxCmd(t, nil, "relay", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "at least 1s: a dead relay's batch waits this long")
}

// Issue 18, item 6: the CLI's details.
func TestCLIDetails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}))
	require.NoError(t, tx.Commit())
	msgs, err := store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.NoError(t, store.MarkFailed(ctx, msgs[0], "unroutable"))
	require.NoError(t, store.MarkFailed(ctx, msgs[1], "unroutable"))

	// discard has --dry-run, and names the table before acting.
	code, out, errOut := outboxCmd(t, nil, "discard", "--table", table, "--dry-run", msgs[0].ID, "0190a0a0-0000-7000-8000-000000000000")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would discard 1 of the 2 id(s) given, the parked messages of table "+table+": "+msgs[0].ID)
	require.Contains(t, out, "dry run: nothing discarded")
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Parked)
	code, _, errOut = outboxCmd(t, nil, "discard", "--table", table, msgs[0].ID)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "discarding 1 message(s) of table "+table)

	// retry --all-parked --dry-run says "would".
	code, out, errOut = outboxCmd(t, nil, "retry", "--table", table, "--all-parked", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would re-arm all 1 parked message(s) of table "+table)
	require.NotContains(t, errOut, "re-arming")

	// No flag's usage has a backquoted word (flag turns it into the
	// value's name), and --metrics-addr shows a loopback address.
	code, out, _ = outboxCmd(t, nil, "relay", "--help")
	require.Equal(t, 0, code)
	require.NotRegexp(t, regexp.MustCompile(`-notify outbox`), out)
	require.Contains(t, out, "outbox schema --notify --apply")
	require.Contains(t, out, "127.0.0.1:9464 (:9464 listens on every interface)")

	// outbox version and --version.
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, _ = outboxCmd(t, nil, args...)
		require.Equal(t, 0, code)
		require.Regexp(t, `^outbox \S+ .*go1\.\d+`, out)
	}
}

// Issue 18, item 4: a database session terminated during the start-up
// check is retried, as the relay's loop retries it, instead of ending the
// process; a missing table still ends it, with advice.
func TestStartupProbeRetriesTerminatedSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.NewDB(t)
	table := dbtest.Table(t)
	var log dbtest.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: logger})
	require.NoError(t, err)
	require.Error(t, probeTable(ctx, store, logger), "a missing table is not waited for")
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))

	// The check waits behind a lock; its session is terminated there.
	locker, err := dbtest.DB(t).BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = locker.ExecContext(ctx, `LOCK TABLE "`+table+`" IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- probeTable(ctx, store, logger) }()
	var pid int
	require.Eventually(t, func() bool {
		err := dbtest.DB(t).QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, table).Scan(&pid)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	_, err = dbtest.DB(t).ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "Checking the table failed; retrying") }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, locker.Rollback())
	require.NoError(t, <-done)
	require.Contains(t, log.String(), "57P01")
}

// Issue 18, item 4: a broker that refuses the relay's login is reported at
// start, at once, as permanent with its advice, while the table is empty.
func TestRelayReportsRefusedLoginAtStart(t *testing.T) {
	t.Parallel()
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--apply")
	require.Equal(t, 0, code, errOut)
	var stdout, stderr dbtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"relay", "--table", table}, &stdout, &stderr, func(k string) string {
			switch k {
			case "DATABASE_URL":
				return dbtest.URL()
			case "AMQP_URL":
				return "amqp://guest:not-the-password@127.0.0.1:5672/"
			}
			return ""
		})
	}()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "The broker refused the relay") }, 20*time.Second, 10*time.Millisecond)
	cancel()
	require.Equal(t, 0, <-done)
	require.Contains(t, stderr.String(), "RabbitMQ refused the credentials")
	require.NotContains(t, stderr.String(), "not-the-password")
	require.Less(t, strings.Index(stderr.String(), "The broker refused the relay"), strings.Index(stderr.String(), "relay: Started"),
		"reported before the relay starts its loop")
}

// Issue 18, item 1: outbox declare declares an exchange, a queue with its
// dead-letter queue and bindings, idempotently; --dry-run declares nothing.
func TestDeclareCommand(t *testing.T) {
	t.Parallel()
	x, q := amqptest.Name(t, "x"), amqptest.Name(t, "q")
	t.Cleanup(func() {
		if ch, err := amqptest.Conn(t).Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_, _ = ch.QueueDelete(q+".dead", false, false, false)
			_ = ch.ExchangeDelete(x, false, false)
		}
	})
	env := map[string]string{"AMQP_URL": amqptest.URL()}
	args := []string{"declare", "--exchange", x, "--queue", q, "--bind", "order.#", "--bind", "payment.#"}
	code, out, errOut := outboxCmd(t, env, append(args, "--dry-run")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would declare queue "+q+".dead (quorum")
	require.Contains(t, out, `would declare binding `+x+` -> `+q+`, key "payment.#"`)
	ch, err := amqptest.Conn(t).Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	require.Error(t, err, "the dry run declared nothing")
	for range 2 {
		code, out, errOut = outboxCmd(t, env, args...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "declared exchange "+x+" (topic, durable)")
	}
	code, _, errOut = outboxCmd(t, env, "declare", "--queue", q, "--bind", "x")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "give --exchange too")
}

// Issue 22, item 2: outbox verify runs relays as child processes of the
// binary, injects every fault (kill, cut-db, cut-broker, stall) in ordered
// mode through an inbox, and reports nothing lost or phantom, as JSON;
// with a fault it does not know, it refuses to start.
func TestVerifyCommand(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	for name, extra := range map[string][]string{
		"ordered":    {"--ordered"},
		"log layout": {"--layout", "log"}, // issue 20: the log layout keeps the promise under the same faults
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"verify", "--duration", "5s", "--rate", "100", "--fault-every", "1s", "--lease", "1s",
				"--inbox", "--keys", "10", "--json"}, extra...)
			rep, stdout, stderr := runVerify(t, bin, args...)
			require.True(t, rep.OK, "%s", stdout)
			require.Zero(t, rep.Lost+rep.Phantom+rep.OrderViolations)
			require.Positive(t, rep.Committed)
			require.Positive(t, rep.RolledBack, "some transactions were rolled back on purpose")
			require.Equal(t, rep.Committed, rep.Inbox.Effects, "every committed event had one effect")
			for _, f := range verifyFaults {
				require.Positive(t, rep.Faults[f], "every fault at least once, however short the run: %v", rep.Faults)
			}
			// Issue 38, item 5: each fault is reported with the messages
			// in flight when it struck.
			injected := 0
			for _, n := range rep.Faults {
				injected += n
			}
			require.Len(t, rep.FaultLog, injected, "one entry per fault injected: %s", stdout)
			for _, e := range rep.FaultLog {
				require.Contains(t, verifyFaults, e.Fault)
				require.NotNil(t, e.InFlight, "the in-flight count of %s at %.1fs was read", e.Fault, e.At)
				require.GreaterOrEqual(t, *e.InFlight, int64(0))
				require.Less(t, e.At, rep.Seconds+1)
			}
			// Progress lines, about one a second (which second the first
			// one names depends on how loaded the machine is: CI once
			// printed the first at 2s).
			require.Regexp(t, `verify:\s+\d+s  written \d+`, stderr)
			require.Zero(t, dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM pg_tables WHERE tablename LIKE $1 || '%'`, rep.Table), "the scratch tables are dropped")
		})
	}

	code, _, errOut := outboxCmd(t, nil, "verify", "--faults", "kill,flood")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown fault "flood"`)
}

// Issue 22, item 2: the report counts an event that never arrived as lost
// and one that arrived without committing as phantom, and fails.
func TestVerifyReportCountsLossAndPhantoms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.Begin()
	require.NoError(t, err)
	ids, err := store.AddIDs(ctx, tx, outbox.Event{Type: "a", Key: "k"}, outbox.Event{Type: "b", Key: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	now := time.Now()
	v := &verifier{o: verifyOptions{ordered: true}, db: db, table: table,
		committed:  map[string]time.Time{ids[0]: now, ids[1]: now},
		arrived:    map[string]time.Time{ids[1]: now, "ghost": now},
		firstByKey: map[string][]string{"k": {ids[1]}}, deliveries: 3, faults: map[string]int{}}
	final, err := v.readTable(ctx)
	require.NoError(t, err)
	rep := v.report(time.Second, final, nil)
	require.Equal(t, 1, rep.Lost)
	require.Equal(t, 1, rep.Phantom)
	require.Equal(t, 1, rep.Duplicates)
	require.False(t, rep.OK)
	v.arrived[ids[0]] = now
	v.firstByKey["k"] = []string{ids[1], ids[0]}
	delete(v.arrived, "ghost")
	rep = v.report(time.Second, final, nil)
	require.Equal(t, 1, rep.OrderViolations, "the second message of the key arrived first")
	require.False(t, rep.OK)
}

// Issue 39: the faults of the duplicates soak that need administrator
// rights, asked for by name: terminate-db ends the relays' database
// sessions (found by their application_name), close-broker has RabbitMQ
// close their connections (found by their connection name). Each ends
// something every time, and nothing is lost.
func TestVerifyAdminFaults(t *testing.T) {
	t.Parallel()
	if _, err := rabbitmqctl(); err != nil {
		t.Skip(err)
	}
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	rep, stdout, stderr := runVerify(t, bin, "verify", "--duration", "6s", "--rate", "100", "--fault-every", "1s", "--lease", "2s",
		"--faults", "terminate-db,close-broker", "--json")
	require.True(t, rep.OK, "%s", stdout)
	require.Zero(t, rep.Lost+rep.Phantom)
	require.Positive(t, rep.Faults["terminate-db"], "%v", rep.Faults)
	require.Positive(t, rep.Faults["close-broker"], "%v", rep.Faults)
	ended := map[string]int64{}
	for _, e := range rep.FaultLog {
		require.NotNil(t, e.Ended, "%s at %.1fs ended nothing it could count; stderr:\n%s", e.Fault, e.At, stderr)
		ended[e.Fault] += *e.Ended
	}
	require.Positive(t, ended["terminate-db"], "relay sessions were terminated")
	require.Positive(t, ended["close-broker"], "relay connections were closed by the broker")
	require.NotContains(t, stderr, "verify: terminate-db:")
	require.NotContains(t, stderr, "verify: close-broker:")
}

// runVerify runs outbox verify --json (bin, args) against the test servers
// and returns its report, its stdout and its stderr; it must exit 0.
func runVerify(t *testing.T, bin string, args ...string) (verifyReport, []byte, string) {
	t.Helper()
	return runVerifyOn(t, bin, dbtest.URL(), args...)
}

// runVerifyOn is runVerify on the database of dbURL.
func runVerifyOn(t *testing.T, bin, dbURL string, args ...string) (verifyReport, []byte, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "AMQP_URL="+amqptest.URL())
	var stderr dbtest.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "%s\n%s", stdout, stderr.String())
	var rep verifyReport
	require.NoError(t, json.Unmarshal(stdout, &rep), "%s", stdout)
	return rep, stdout, stderr.String()
}
