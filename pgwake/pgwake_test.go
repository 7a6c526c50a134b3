package pgwake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
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
