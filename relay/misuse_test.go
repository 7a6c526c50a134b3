package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// misuseStore is a fakeStore whose method named failing returns err (after
// the first call when later is set: a table that goes bad while the relay
// runs).
type misuseStore struct {
	*fakeStore
	failing string
	later   bool
	err     error
	calls   atomic.Int32
}

func (s *misuseStore) fails(method string) error {
	if method != s.failing || (s.later && s.calls.Add(1) == 1) {
		return nil
	}
	return s.err
}

func (s *misuseStore) Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error) {
	if err := s.fails("Claim"); err != nil {
		return nil, err
	}
	return s.fakeStore.Claim(ctx, n, lease)
}
func (s *misuseStore) CheckOrdering(context.Context) error { return s.fails("CheckOrdering") }
func (s *misuseStore) Maintain(context.Context) error      { return s.fails("Maintain") }
func (s *misuseStore) Reconcile(context.Context) (int64, int64, error) {
	return 0, 0, s.fails("Reconcile")
}
func (s *misuseStore) PurgePublished(context.Context, time.Duration) (int64, error) {
	return 0, s.fails("PurgePublished")
}
func (s *misuseStore) MarkPublished(ctx context.Context, msgs ...outbox.Message) error {
	if err := s.fails("MarkPublished"); err != nil {
		return err
	}
	return s.fakeStore.MarkPublished(ctx, msgs...)
}

// Issue 47, item 10: a table that is not an outbox table of this version
// (outbox.ErrInvalidTable) is misuse, whichever of the store's methods
// reports it: Run stops with that error instead of logging it forever.
func TestInvalidTableStopsRunFromEveryStoreCall(t *testing.T) {
	t.Parallel()
	invalid := fmt.Errorf("outbox: reading the layout of t: %w: t is a foreign table", outbox.ErrInvalidTable)
	for _, tc := range []struct {
		method string
		later  bool
	}{
		{method: "Claim"},
		{method: "CheckOrdering"},               // when Run starts
		{method: "CheckOrdering", later: true},  // read again while it runs
		{method: "Maintain"},                    // the upkeep beside the pipeline
		{method: "Reconcile"},                   // once at the start
		{method: "PurgePublished"},              // with PurgeAfter
		{method: "MarkPublished", later: false}, // a batch's settle
	} {
		t.Run(fmt.Sprintf("%s/later=%v", tc.method, tc.later), func(t *testing.T) {
			t.Parallel()
			store := &misuseStore{fakeStore: &fakeStore{}, failing: tc.method, later: tc.later, err: invalid}
			store.push(msgs("a")...)
			pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
			r := newTestRelay(t, store, pub, &Config{PurgeAfter: time.Hour})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := r.Run(ctx)
			require.ErrorIs(t, err, outbox.ErrInvalidTable)
			require.ErrorContains(t, err, "is a foreign table")
			require.NoError(t, ctx.Err(), "Run stopped on its own, not at the test's deadline")
		})
	}
}

// database/sql does not export its error for a closed *sql.DB; the relay
// provokes it once. If database/sql ever changed it, this says so.
func TestErrDBClosedIsDatabaseSQLs(t *testing.T) {
	t.Parallel()
	require.EqualError(t, errDBClosed(), "sql: database is closed")
	db := dbtest.NewDB(t)
	require.NoError(t, db.Close())
	require.ErrorIs(t, db.PingContext(context.Background()), errDBClosed(), "the same value a closed pool returns")
}

// Issue 47, item 12: a *sql.DB closed under a running relay (by the
// program, too early) cannot come back: Run stops with an error that says
// so, instead of retrying "sql: database is closed" forever. Likewise a
// relay started on a closed pool does not start.
func TestClosedDBStopsRun(t *testing.T) {
	t.Parallel()
	db := dbtest.NewDB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	ctx := context.Background()
	if dbtest.LogLayout() {
		require.NoError(t, store.CreateLogSchemaIfAbsent(ctx))
	} else {
		require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	}
	var published atomic.Int32
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		published.Add(int32(len(m)))
		return make([]error, len(m))
	})
	r := newTestRelay(t, store, pub, &Config{PollInterval: 10 * time.Millisecond})
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "t", Payload: []byte(`{}`)}))
	require.NoError(t, tx.Commit())
	require.Eventually(t, func() bool { return r.Stats().Published == 1 }, 10*time.Second, 5*time.Millisecond, "the relay works")

	require.NoError(t, db.Close())
	err = <-done
	require.ErrorIs(t, err, errDBClosed())
	require.ErrorContains(t, err, "*sql.DB was closed")
	require.NoError(t, runCtx.Err(), "Run stopped on its own, not at the test's deadline")
	require.EqualValues(t, 1, published.Load())

	// Started on the closed pool, it stops at once.
	r = newTestRelay(t, store, pub, nil)
	err = r.Run(runCtx)
	require.ErrorIs(t, err, errDBClosed())
	require.NoError(t, runCtx.Err())
	require.False(t, errors.Is(err, outbox.ErrInvalidTable))
}
