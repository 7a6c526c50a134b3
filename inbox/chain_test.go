package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// Issue 12: the whole chain under faults. Writers commit events into an
// outbox; a relay publishes them while its broker connections are closed
// and its database sessions terminated (so it publishes some twice); an
// inbox consumer applies them while its own connection is closed. Every
// committed event's effect is applied exactly once.
func TestChainUnderFaultsExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 2000
	ctx := context.Background()
	w := setup(t, 0)
	require.NoError(t, w.ch.Cancel(testConsumerTag, false))

	// The outbox side: its own table, a relay on a pool whose sessions the
	// test terminates, routed to the inbox's queue.
	app := strings.ReplaceAll(amqptest.Name(t, "relay"), ".", "_")
	relayDB, err := sql.Open("pgx", dbtest.URLWith(t, "application_name", app))
	require.NoError(t, err)
	t.Cleanup(func() { relayDB.Close() })
	store, err := outbox.NewStore(relayDB, &outbox.StoreConfig{Table: dbtest.Table(t), Router: func(outbox.Event) (string, string) { return "", w.queue },
		Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	relayName, consumerName := amqptest.Name(t, "relay"), amqptest.Name(t, "consumer")
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqptest.URL(), ConnectionName: relayName, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	r, err := relay.New(store, pub, &relay.Config{BatchSize: 50, Lease: 3 * time.Second, BackoffMax: 200 * time.Millisecond, Logger: dbtest.Logger(t)})
	require.NoError(t, err)

	c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: w.effect, URLs: []string{amqptest.URL()},
		ConnectionName: consumerName, BackoffMax: 200 * time.Millisecond, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- c.Run(runCtx) }()

	for i := 0; i < n; i += 20 {
		tx, err := w.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		evts := make([]outbox.Event, 20)
		for k := range evts {
			evts[k] = outbox.Event{Type: "payment.received", Key: fmt.Sprint(i + k), Payload: []byte(`{}`)}
		}
		require.NoError(t, store.Add(ctx, tx, evts...))
		require.NoError(t, tx.Commit())
		switch i {
		case 400, 1200:
			amqptest.CloseNamedConnections(t, relayName)
		case 800:
			amqptest.CloseNamedConnections(t, consumerName)
		case 600, 1600:
			dbtest.Count(t, w.db, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) k`, app)
		}
	}
	require.Eventually(t, func() bool { return w.effects(t) >= n }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { n, err := store.Pending(ctx); return err == nil && n == 0 }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return w.queued(t, w.queue) == 0 }, time.Minute, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.NoError(t, pub.Close())

	require.EqualValues(t, n, w.effects(t), "no effect applied twice")
	require.EqualValues(t, n, dbtest.Count(t, w.db, `SELECT count(DISTINCT message_id) FROM "`+w.table+`_effects"`), "none lost")
	t.Logf("relay %+v; consumer %+v", r.Stats(), c.Stats())
}
