package pgwake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/tcpproxy"
	"github.com/acemq/outbox/pgwake"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestWakesOnCommitOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	ddl, err := outbox.NotifySchema(table)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, ddl)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, ddl)
	require.NoError(t, err, "idempotent")

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake, err := pgwake.Listen(lctx, &pgwake.Config{DatabaseURL: dbtest.URL(), Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)

	// A rolled-back write wakes nobody.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}))
	require.NoError(t, tx.Rollback())

	// A committed one does.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "b"}))
	select {
	case <-wake:
		t.Fatal("woken before the commit")
	default:
	}
	require.NoError(t, tx.Commit())
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of the commit")
	}
	select {
	case <-wake:
		t.Fatal("the rolled-back write woke the listener")
	default:
	}
}

func TestListenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := pgwake.Listen(ctx, &pgwake.Config{})
	require.ErrorContains(t, err, "DatabaseURL is required")
	_, err = pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: dbtest.URL(), Table: "bad table"})
	require.ErrorIs(t, err, outbox.ErrInvalidTable)
	_, err = pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: "postgres://postgres:s3cret@127.0.0.1:1/test"})
	require.ErrorContains(t, err, "pgwake: connecting")
	require.NotContains(t, err.Error(), "s3cret")
	// Issue 13, B5: pgx's parse errors quote the string, and redact a
	// URL's ?password= only when the URL itself does not parse.
	for _, bad := range []string{
		"postgres://postgres@127.0.0.1/test?password=s3cret&sslmode=bogus",
		"host=127.0.0.1 password=s3cret sslmode=bogus",
		"postgres://postgres:s3cret@127.0.0.1:bad/test",
	} {
		_, err = pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: bad})
		require.ErrorContains(t, err, "not a valid PostgreSQL URL")
		require.NotContains(t, err.Error(), "s3cret")
	}
}

func TestNotifyChannel(t *testing.T) {
	t.Parallel()
	ch, err := outbox.NotifyChannel("billing.outbox")
	require.NoError(t, err)
	require.Equal(t, "outbox:billing.outbox", ch)
	long, err := outbox.NotifyChannel("a23456789012345678901234567890123456789012345678.b23456789012345678901234567890123456789012345678")
	require.NoError(t, err)
	require.LessOrEqual(t, len(long), 63)
}

// Issue 43: one connection listens for many tables. Each table's
// subscribers are woken by its own commits only; a subscription that ends
// is woken no more; tables subscribed to while the listener waits are
// listened on before Subscribe returns; and after the connection is
// killed the listener reconnects, wakes every subscriber for what it may
// have missed, and listens on every table again.
func TestListenerWakesManyTablesOnOneConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	tables := []string{dbtest.Table(t) + "_a", dbtest.Table(t) + "_b", dbtest.Table(t) + "_c"}
	stores := make([]*outbox.Store, len(tables))
	for i, table := range tables {
		var err error
		stores[i], err = outbox.NewStore(db, &outbox.StoreConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, stores[i].CreateRowsSchemaIfAbsent(ctx))
		ddl, err := outbox.NotifySchema(table)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, ddl)
		require.NoError(t, err)
		t.Cleanup(func() {
			drop, _ := outbox.DropSchema(table)
			_, _ = db.Exec(drop)
		})
	}
	write := func(i int) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, stores[i].Add(ctx, tx, outbox.Event{Type: "t"}))
		require.NoError(t, tx.Commit())
	}
	wokenWithin := func(wake <-chan struct{}, d time.Duration) bool {
		select {
		case <-wake:
			return true
		case <-time.After(d):
			return false
		}
	}
	woken := func(wake <-chan struct{}) bool { return wokenWithin(wake, 10*time.Second) }
	pending := func(wake <-chan struct{}) bool {
		select {
		case <-wake:
			return true
		default:
			return false
		}
	}

	app := "pgwake_" + tables[0]
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l, err := pgwake.NewListener(lctx, &pgwake.ListenerConfig{DatabaseURL: dbtest.URLWith(t, "application_name", app), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	wakes := make([]<-chan struct{}, len(tables))
	stops := make([]func(), len(tables))
	for i, table := range tables {
		wakes[i], stops[i], err = l.Subscribe(ctx, table)
		require.NoError(t, err)
	}
	backends := func() int64 {
		return dbtest.Count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app)
	}
	require.EqualValues(t, 1, backends(), "one connection for every table")

	write(1)
	require.True(t, woken(wakes[1]), "the written table's subscriber is woken")
	write(0)
	require.True(t, woken(wakes[0]))
	require.False(t, pending(wakes[1]) || pending(wakes[2]), "no other table's subscriber is woken")

	// Notifications arrive in commit order on the one connection: once
	// the second table's is in, the first's would have been too.
	stops[0]()
	write(0)
	write(1)
	require.True(t, woken(wakes[1]))
	require.False(t, pending(wakes[0]), "a subscription that ended is woken no more")

	// The listening connection is killed: the listener comes back on a new
	// one, wakes every subscriber, and listens again.
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app))
	require.True(t, woken(wakes[1]), "woken after the reconnection")
	require.True(t, woken(wakes[2]), "woken after the reconnection")
	require.Eventually(t, func() bool { return backends() == 1 }, 10*time.Second, 10*time.Millisecond)
	// The new connection's LISTENs may lag its connect by a round trip:
	// a write made before they land wakes nobody, so write until one does.
	require.Eventually(t, func() bool { write(2); return wokenWithin(wakes[2], time.Second) }, 30*time.Second, time.Millisecond)
	require.False(t, pending(wakes[0]))
}

// While the listening connection is down and cannot be made again,
// Subscribe returns at once (the table is listened on when the connection
// is back) instead of waiting for a connection that may not come: a relay
// adding tables must not stall on its wake-ups.
func TestListenerSubscribeWhileDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy, err := tcpproxy.New("127.0.0.1:5432")
	require.NoError(t, err)
	var logs dbtest.Buffer
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	url := "postgres://postgres@" + proxy.Addr().String() + "/test?sslmode=disable"
	l, err := pgwake.NewListener(lctx, &pgwake.ListenerConfig{DatabaseURL: url, Logger: dbtest.LoggerTo(t, &logs)})
	require.NoError(t, err)
	_, _, err = l.Subscribe(ctx, dbtest.Table(t)+"_a")
	require.NoError(t, err)
	require.NoError(t, proxy.Close()) // the connection is cut, and no new one can be made
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "Lost the listening connection") }, 10*time.Second, time.Millisecond)
	sctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	wake, unsubscribe, err := l.Subscribe(sctx, dbtest.Table(t)+"_b")
	require.NoError(t, err, "returned before its context ended")
	require.NotNil(t, wake)
	unsubscribe()
}
