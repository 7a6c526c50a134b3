package outbox_test

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/tcpproxy"
)

// proxiedDB opens a pool of the test's own whose connections go through a
// proxy the test can hold (tcpproxy.Proxy.Hold).
func proxiedDB(t *testing.T) (*sql.DB, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	if host == "" {
		t.Skip("the test database URL names no TCP host; the proxy needs one")
	}
	proxy, err := tcpproxy.New(net.JoinHostPort(host, port))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(proxy.Addr().Port))
	db, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

// setupLayout is setup or setupLog, by layout ("rows" or "log").
func setupLayout(t *testing.T, layout string) *testBundle {
	t.Helper()
	if layout == "log" {
		return setupLog(t, nil)
	}
	return setup(t, nil)
}

// claimCutOff holds the proxy's one connection, makes a claim on it and
// waits until taken (a count, on db) shows that it committed want
// messages on the server; then it ends the claim's context: the caller
// never hears of its claim and gets an error.
func claimCutOff(t *testing.T, proxy *tcpproxy.Proxy, store *outbox.Store, db *sql.DB, taken string, want int64) {
	t.Helper()
	require.Equal(t, 1, proxy.Hold(), "the pool's one connection")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	claimed := make(chan error, 1)
	go func() {
		_, err := store.Claim(ctx, 10, time.Hour)
		claimed <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); dbtest.Count(t, db, taken) < want; {
		require.True(t, time.Now().Before(deadline), "the claim did not commit in 30s")
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	require.Error(t, <-claimed, "the caller never heard of its claim")
}

// A claim that commits on the server while its client never hears back
// (the reply is lost, the caller's context ends) gives back what it took:
// the messages are claimed again at once, not after the claim's lease of
// an hour, and none is lost.
func TestClaimCutOffAfterCommitGivesItsMessagesBack(t *testing.T) {
	for _, layout := range []string{"rows", "log"} {
		t.Run(layout, func(t *testing.T) {
			ctx := context.Background()
			b := setupLayout(t, layout)
			pdb, proxy := proxiedDB(t)
			store, err := outbox.NewStore(pdb, &outbox.StoreConfig{Table: b.table, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			// A clock that stands still: once the first claim has made a
			// log table's looks, the next one only claims new events.
			if layout == "log" {
				_, err := store.Layout(ctx)
				require.NoError(t, err)
				now := time.Now()
				outbox.SetLogClock(store, func() time.Time { return now })
			}
			// The first claim, on an empty table, prepares the claim's
			// statements on the pool's one connection.
			msgs, err := store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Empty(t, msgs)

			b.addCommitted(t, events(3)...)
			// The claim committed on the server: its lease shows.
			taken := `SELECT count(*) FROM "` + b.table + `_messages" WHERE claimed_until > now()`
			if layout == "rows" {
				taken = `SELECT count(*) FROM "` + b.table + `" WHERE claimed_until > now()`
			}
			claimCutOff(t, proxy, store, b.db, taken, 3)

			// Through a new connection, not held: the messages are
			// claimed again at once, each once.
			msgs, err = store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Len(t, msgs, 3, "given back and claimed again")
			require.Len(t, map[string]bool{msgs[0].ID: true, msgs[1].ID: true, msgs[2].ID: true}, 3)
			require.NoError(t, store.MarkPublished(ctx, msgs...))
			pending, err := store.Pending(ctx)
			require.NoError(t, err)
			require.Zero(t, pending)
		})
	}
}

// The same for a log table's claim of a failed message due again: it is
// given back to the failed table and claimed again at once.
func TestLogFailedClaimCutOffAfterCommitGivesItBack(t *testing.T) {
	ctx := context.Background()
	b := setupLog(t, nil)
	pdb, proxy := proxiedDB(t)
	store, err := outbox.NewStore(pdb, &outbox.StoreConfig{Table: b.table, Logger: dbtest.Logger(t),
		Backoff: func(int) time.Duration { return 0 }})
	require.NoError(t, err)
	_, err = store.Layout(ctx)
	require.NoError(t, err)
	now := time.Now()
	outbox.SetLogClock(store, func() time.Time { return now })
	msgs, err := store.Claim(ctx, 10, time.Hour) // prepares the claims of new and of failed messages
	require.NoError(t, err)
	require.Empty(t, msgs)
	b.addCommitted(t, events(1)...)
	msgs, err = store.Claim(ctx, 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	failed := msgs[0]
	require.NoError(t, store.MarkFailed(ctx, failed, "once")) // due again at once; the next claim takes it

	claimCutOff(t, proxy, store, b.db, `SELECT count(*) FROM "`+b.table+`_failed" WHERE claimed_until > now()`, 1)

	msgs, err = store.Claim(ctx, 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "given back and claimed again")
	require.Equal(t, failed.ID, msgs[0].ID)
	require.Equal(t, 1, msgs[0].Attempts, "giving back counts no attempt")
}
