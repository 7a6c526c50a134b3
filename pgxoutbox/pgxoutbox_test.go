package pgxoutbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/pgxoutbox"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// setup gives the test a store on a table of its own, in the given mode,
// and a native pgx connection.
func setup(t *testing.T, ordering outbox.Ordering) (*outbox.Store, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	store, err := outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Table: dbtest.Table(t), Logger: dbtest.Logger(t), Ordering: ordering})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	conn, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return store, conn
}

func TestAddThroughAPgxTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, conn := setup(t, outbox.Unordered)

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "rolled.back"}))
	require.NoError(t, tx.Rollback(ctx))

	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	evts := make([]outbox.Event, 150) // two INSERTs and a savepoint
	for i := range evts {
		evts[i] = outbox.Event{Type: "committed", Key: "k", Payload: []byte(`{}`), Headers: map[string]string{"h": "v"}}
	}
	require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), evts...))
	require.NoError(t, tx.Commit(ctx))

	n, err := store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 150, n, "the rolled back event is gone, the committed ones are there")
	msgs, err := store.Claim(ctx, 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"h": "v"}, msgs[0].Headers)

	require.ErrorIs(t, store.Add(ctx, pgxoutbox.Tx(nil), outbox.Event{Type: "x"}), outbox.ErrNoTransaction)
}

// TestOrderedAddThroughAPgxTransaction: ordered mode's key locks go through
// pgx's own protocol too.
func TestOrderedAddThroughAPgxTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, conn := setup(t, outbox.OrderedByKey)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "a", Key: "order-1"}, outbox.Event{Type: "b", Key: `order-"2"`}))
	var keys, slots int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE mode = 'ExclusiveLock'), count(*) FILTER (WHERE mode = 'ShareLock')
FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&keys, &slots))
	require.Equal(t, 2, keys, "one lock per key, held by the transaction")
	require.True(t, slots == 1 || slots == 2, "and its slot's, shared (%d)", slots)
	require.NoError(t, tx.Commit(ctx))
	n, err := store.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}
