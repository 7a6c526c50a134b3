package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // the test's own server
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// Issue 10, item 4: `outbox relay --metrics-addr` serves the metrics in
// Prometheus' text format, /healthz and /readyz; scraped from the built
// binary.
func TestRelayMetricsEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	consumer := amqptest.Consume(t, conn, top.Queue)
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange(top.Exchange)})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.placed"}, outbox.Event{Type: "order.placed"}))
	require.NoError(t, tx.Commit())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	var stderr dbtest.Buffer
	cmd := exec.Command(bin, "relay", "--table", table, "--metrics-addr", addr)
	// GOMAXPROCS and GOMEMLIMIT unset (the last value wins): the relay's
	// own defaults.
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL(), "GOMAXPROCS=", "GOMEMLIMIT=")
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	require.Eventually(t, func() bool { return consumer.Distinct() == 2 }, 30*time.Second, 10*time.Millisecond)
	// One thread, and a heap limit for the batches in flight (the defaults:
	// (4 + 1) × 64 MiB + 32 MiB).
	require.Regexp(t, `msg="relay: Runtime" table=\S+ gomaxprocs=1 memory_limit=369098752`, stderr.String())
	// Delivered is not yet settled: the settle (and its metric) follows the
	// broker's confirm.
	require.Eventually(t, func() bool {
		n, err := store.Pending(ctx)
		return err == nil && n == 0
	}, 30*time.Second, 10*time.Millisecond)
	code, body := get(t, "http://"+addr+"/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool { code, _ := get(t, "http://"+addr+"/readyz"); return code == http.StatusOK }, 10*time.Second, 10*time.Millisecond)

	var metrics string
	require.Eventually(t, func() bool { // the settle's histogram is recorded right after the marks
		code, metrics = get(t, "http://"+addr+"/metrics")
		return code == http.StatusOK && strings.Contains(metrics, "\noutbox_settle_duration_seconds_count")
	}, 10*time.Second, 10*time.Millisecond, metrics)
	for _, name := range []string{
		"messaging_client_sent_messages_total", "messaging_client_operation_duration_seconds_bucket",
		"outbox_lag_seconds_bucket", "outbox_messages_claimed_total", "outbox_claim_duration_seconds_count",
		"outbox_settle_duration_seconds_count", "outbox_pending", "outbox_parked", "outbox_oldest_pending_age_seconds", "outbox_keys_blocked",
		"outbox_held", "outbox_unroutable_total", "outbox_ready", "outbox_in_flight", "outbox_delayed", "outbox_oldest_ready_age_seconds",
	} {
		require.Contains(t, metrics, "\n"+name, "metric %s in:\n%s", name, metrics)
	}
	require.Contains(t, metrics, `outbox_table="`+table+`"`)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), stderr.String())
	require.True(t, strings.Contains(stderr.String(), "relay: Serving metrics"), stderr.String())

	// Issue 19: the bench runs the relay as a process of its own.
	bench := exec.Command(bin, "bench", "--messages", "200", "--rate", "200", "--runs", "1", "--relay-process")
	bench.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL())
	out, err = bench.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "relay in another process: p50")

	// An idle relay whose broker does not answer is not ready; one whose
	// broker refuses the login says so, not a timeout of its own (issue
	// 18, item 4: RabbitMQ refuses after ~3s).
	// The first also runs under GOMAXPROCS set by its environment, which
	// the relay keeps.
	logged := notReady(t, bin, table, addr, "amqp://guest:guest@127.0.0.1:1/", "broker unreachable", "GOMAXPROCS=2")
	require.Regexp(t, `msg="relay: Runtime" (table=\S+ )?gomaxprocs=2 `, logged)
	notReady(t, bin, table, addr, strings.Replace(amqptest.URL(), "guest:guest@", "guest:wrong-password@", 1), "username or password not allowed")
}

// notReady runs a relay with the broker at amqpURL (and env added to its
// environment) until its /readyz answers 503 with want in its body, and
// returns what the relay logged.
func notReady(t *testing.T, bin, table, addr, amqpURL, want string, env ...string) string {
	t.Helper()
	var stderr dbtest.Buffer
	cmd := exec.Command(bin, "relay", "--table", table, "--metrics-addr", addr)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqpURL), env...)
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Eventually(t, func() bool {
		code, body := get(t, "http://"+addr+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, want)
	}, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	return stderr.String()
}
