package relay_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
	"github.com/acemq/outbox/relay"
)

// mysqlSetup is setup on the real MariaDB (or MySQL) of TEST_MYSQL_DSN, in a
// database of the test's own; dsn is that database's.
func mysqlSetup(t testing.TB, cfg *outbox.StoreConfig) (b *testBundle, dsn string) {
	t.Helper()
	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Router = outbox.ToExchange(top.Exchange)
	cfg.Logger = dbtest.Logger(t)
	dsn = mysqltest.DSN(t)
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(context.Background()))
	return &testBundle{db: db, store: store, top: top, consumer: amqptest.Consume(t, conn, top.Queue)}, dsn
}

// mysqlIDs returns the ids of the messages of the table that where holds.
func mysqlIDs(t testing.TB, db *sql.DB, where string) map[string]bool {
	t.Helper()
	rows, err := db.Query("SELECT id FROM outbox WHERE " + where)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out[id] = true
	}
	require.NoError(t, rows.Err())
	return out
}

// Issue 41: the relay on MySQL/MariaDB, as on PostgreSQL: writers commit
// while two relays run; every message is delivered, once in a run without
// faults, and nothing stays pending.
func TestMySQLEndToEnd(t *testing.T) {
	t.Parallel()
	const writers, perWriter = 4, 1500
	b, _ := mysqlSetup(t, nil)
	r1, _ := start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: 200, PollInterval: 20 * time.Millisecond})
	r2, _ := start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: 200, PollInterval: 20 * time.Millisecond})
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < perWriter; i += 10 {
				tx, err := b.db.BeginTx(ctx, nil)
				if !assertNoError(t, err) {
					return
				}
				evts := make([]outbox.Event, 10)
				for j := range evts {
					evts[j] = small(w*perWriter + i + j)
				}
				if !assertNoError(t, b.store.Add(ctx, tx, evts...)) || !assertNoError(t, tx.Commit()) {
					return
				}
			}
		}()
	}
	wg.Wait()
	const n = writers * perWriter
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireDelivered(t, b.consumer.IDs(), mysqlIDs(t, b.db, "true"))
	require.Equal(t, n, b.consumer.Total(), "no duplicates in a run without faults")
	require.EqualValues(t, n, r1.Stats().Published+r2.Stats().Published)
	t.Logf("relay 1 published %d, relay 2 %d", r1.Stats().Published, r2.Stats().Published)
	d := b.consumer.Last()
	require.Equal(t, "order.placed", d.Type)
	require.Regexp(t, `^order-\d+$`, d.Headers[relay.KeyHeader])
}

// Issue 41: KILL CONNECTION of every session of the relay's pool, again
// and again while it relays: the relay reconnects, and every message is
// delivered.
func TestMySQLRelaySessionsKilled(t *testing.T) {
	t.Parallel()
	const n = 5000
	b, dsn := mysqlSetup(t, nil)
	b.write(t, n, 500, small)
	relayDB, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { relayDB.Close() })
	relayStore, err := outbox.NewStore(relayDB, &outbox.StoreConfig{Router: outbox.ToExchange(b.top.Exchange), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	start(t, relayStore, newPublisher(t, nil), &relay.Config{BatchSize: 100, PollInterval: 20 * time.Millisecond, Lease: 3 * time.Second})

	// The sessions of the test's pool are not the relay's: kill the others
	// of the test's database.
	ctx := context.Background()
	admin, err := b.db.Conn(ctx)
	require.NoError(t, err)
	defer admin.Close()
	var killed int
	for round := 0; round < 8 && b.consumer.Distinct() < n; round++ {
		require.Eventually(t, func() bool { return b.consumer.Distinct() >= (round+1)*n/10 }, time.Minute, 5*time.Millisecond)
		rows, err := admin.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()`)
		require.NoError(t, err)
		ids, err := scanInts(rows)
		require.NoError(t, err)
		for _, id := range ids {
			if _, err := admin.ExecContext(ctx, "KILL CONNECTION ?", id); err == nil {
				killed++
			}
		}
	}
	require.Positive(t, killed)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireDelivered(t, b.consumer.IDs(), mysqlIDs(t, b.db, "true"))
	t.Logf("%d sessions killed; %d deliveries of %d messages (%d twice)", killed, b.consumer.Total(), n, b.consumer.Total()-n)
}

func scanInts(rows *sql.Rows) ([]int64, error) {
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Issue 41: a relay process SIGKILLed while it holds a claimed batch on
// MySQL: another relay delivers the rest once the lease expires, and only
// what the dead one held can be delivered twice.
func TestMySQLRelayKilledMidBatch(t *testing.T) {
	t.Parallel()
	const n = 3000
	b, dsn := mysqlSetup(t, nil)
	b.write(t, n, 500, small)

	kill := startHelperRelay(t, "OUTBOX_HELPER_MYSQL_DSN="+dsn, "OUTBOX_HELPER_EXCHANGE="+b.top.Exchange)
	require.Eventually(t, func() bool { return b.consumer.Distinct() >= 1000 }, time.Minute, 5*time.Millisecond)
	kill()
	held := dbtest.Count(t, b.db, "SELECT count(*) FROM outbox WHERE claim_token IS NOT NULL AND published_at IS NULL")
	require.Positive(t, held, "the process died holding a claimed batch")
	delivered := b.consumer.Distinct()
	require.Less(t, delivered, n)

	start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: 100, PollInterval: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireDelivered(t, b.consumer.IDs(), mysqlIDs(t, b.db, "true"))
	dups := b.consumer.Total() - b.consumer.Distinct()
	t.Logf("killed after %d of %d delivered, holding %d claimed rows; %d delivered twice", delivered, n, held, dups)
	require.LessOrEqual(t, dups, int(held), "only what the dead relay held can be delivered twice")
}
