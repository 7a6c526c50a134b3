package main

import (
	"bufio"
	"context"
	"fmt"
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
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
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
		"outbox_held", "outbox_unroutable_total", "outbox_ready", "outbox_in_flight", "outbox_retrying", "outbox_oldest_ready_age_seconds",
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

// request sends GET /healthz on conn, keeping it alive, and reads the
// answer within wait: its status code, or the read's error.
func request(t *testing.T, conn net.Conn, br *bufio.Reader, wait time.Duration) (int, error) {
	t.Helper()
	_, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"))
	require.NoError(t, err)
	return answer(t, conn, br, wait)
}

// answer reads a response on conn within wait.
func answer(t *testing.T, conn net.Conn, br *bufio.Reader, wait time.Duration) (int, error) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, nil
}

func dialServer(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn, bufio.NewReader(conn)
}

func testServer(t *testing.T, lim serveLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := serveHTTP(ln, mux, lim, dbtest.Logger(t))
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// Issue 47, item 6: the metrics server closed no idle keep-alive
// connection, and 20,000 of them took the relay's file descriptors. It
// closes one idle past its timeout, and the connection's slot serves the
// next client.
func TestMetricsServerClosesIdleConnections(t *testing.T) {
	t.Parallel()
	require.Positive(t, metricsLimits.idle, "the relay's metrics server has an idle timeout")
	require.Positive(t, metricsLimits.readHeader)
	require.Positive(t, metricsLimits.write)
	require.Positive(t, metricsLimits.maxConns, "and a cap on its connections")

	addr := testServer(t, serveLimits{readHeader: 5 * time.Second, write: 5 * time.Second, idle: 200 * time.Millisecond, maxConns: 1})
	conn, br := dialServer(t, addr)
	code, err := request(t, conn, br, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	// Kept alive, then idle: the server closes it (EOF) well before the
	// read's deadline, which it would otherwise reach.
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "closed by the server, not timed out by the client")
	t.Logf("closed by the server after %s idle", time.Since(start).Round(time.Millisecond))

	next, nbr := dialServer(t, addr)
	code, err = request(t, next, nbr, 5*time.Second)
	require.NoError(t, err, "the closed connection gave its slot back")
	require.Equal(t, http.StatusOK, code)
}

// Issue 47, item 6: connections beyond the cap wait to be accepted,
// holding no file descriptor of the server, until one served closes.
func TestMetricsServerCapsConnections(t *testing.T) {
	t.Parallel()
	addr := testServer(t, serveLimits{readHeader: 5 * time.Second, write: 5 * time.Second, idle: time.Minute, maxConns: 2})
	var held []net.Conn
	for range 2 {
		conn, br := dialServer(t, addr)
		code, err := request(t, conn, br, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		held = append(held, conn)
	}
	extra, ebr := dialServer(t, addr) // the kernel completes the handshake
	_, err := request(t, extra, ebr, 300*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "no answer while two connections are held")
	require.True(t, ne.Timeout(), "%v", err)

	require.NoError(t, held[0].Close())
	code, err := answer(t, extra, ebr, 5*time.Second)
	require.NoError(t, err, "served once a slot is free")
	require.Equal(t, http.StatusOK, code)
}
