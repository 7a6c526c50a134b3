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
	for _, cmd := range [][]string{{"status"}, {"purge", "--older-than", "1h"}, {"inbox", "dead", "--consumer", "c"}} {
		code, _, errOut = outboxCmd(t, nil, append(cmd, "--table", "a", "--table", "b")...)
		require.Equal(t, 2, code, "outbox %v", cmd)
		require.Contains(t, errOut, "given twice")
	}
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
	write := func(s *outbox.Store, n int) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for range n {
			require.NoError(t, s.Add(ctx, tx, outbox.Event{Type: queue}))
		}
		require.NoError(t, tx.Commit())
	}
	received := func(n int) {
		t.Helper()
		for range n {
			select {
			case d := <-deliveries:
				require.NoError(t, d.Ack(false))
			case <-time.After(30 * time.Second):
				t.Fatal("the relay published too little")
			}
		}
	}
	write(stores[0], 5)
	write(stores[1], 7)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stdout, stderr dbtest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"relay", "--table", stores[0].Table(), "--table", stores[1].Table(), "--metrics-addr", addr}, &stdout, &stderr,
			func(k string) string {
				return map[string]string{"DATABASE_URL": dbtest.URL(), "AMQP_URL": amqptest.URL()}[k]
			})
	}()
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
	_, err = db.ExecContext(ctx, `DROP TABLE "`+stores[1].Table()+`" CASCADE`)
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
