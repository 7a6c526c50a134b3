package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
	return mysqlSetupFunc(t, cfg, nil)
}

// mysqlSetupFunc is mysqlSetup whose consumer also calls fn for every
// delivery.
func mysqlSetupFunc(t testing.TB, cfg *outbox.StoreConfig, fn func(amqp.Delivery)) (b *testBundle, dsn string) {
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
	return &testBundle{db: db, store: store, top: top, consumer: amqptest.ConsumeFunc(t, conn, top.Queue, fn)}, dsn
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

// mysqlIDsByKey returns the ids of each key's messages in their key's
// order (ord, then seq).
func mysqlIDsByKey(t testing.TB, db *sql.DB) map[string][]string {
	t.Helper()
	rows, err := db.Query("SELECT event_key, id FROM outbox WHERE event_key <> '' ORDER BY ord, seq")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var k, id string
		require.NoError(t, rows.Scan(&k, &id))
		out[k] = append(out[k], id)
	}
	require.NoError(t, rows.Err())
	return out
}

// Issue 41: the ordered chaos test on MariaDB. Four writers (an ordered
// store, an unordered one and plain INSERTs, the order being the
// table's) and four relays in ordered mode, one a process SIGKILLed
// holding claims, one shut down and replaced, their broker connections
// closed twice and their database sessions killed: every message
// delivered, and every key's first deliveries in the order of writing.
func TestMySQLOrderedChaos(t *testing.T) {
	t.Parallel()
	const writers = 3
	total := dbtest.EnvInt(t, "OUTBOX_CHAOS_MESSAGES", 20_000) / writers * writers
	keys := max(total/20, 1)
	log := amqptest.NewOrderLog()
	b, dsn := mysqlSetupFunc(t, &outbox.StoreConfig{Ordering: outbox.OrderedByKey}, log.Record)
	name := amqptest.Name(t, "relay")

	kill := startHelperRelay(t, "OUTBOX_HELPER_MYSQL_DSN="+dsn, "OUTBOX_HELPER_EXCHANGE="+b.top.Exchange, "OUTBOX_HELPER_ORDERED=1")
	relayDB, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { relayDB.Close() })
	relayStore, err := outbox.NewStore(relayDB, &outbox.StoreConfig{Ordering: outbox.OrderedByKey, Router: outbox.ToExchange(b.top.Exchange), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	cfg := func() *relay.Config {
		return &relay.Config{BatchSize: 100, Lease: 3 * time.Second, PollInterval: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	}
	var stops []func()
	for range 3 {
		_, stop := start(t, relayStore, newPublisher(t, &relay.AMQPConfig{ConnectionName: name}), cfg())
		stops = append(stops, stop)
	}

	unordered, err := outbox.NewStore(nil, &outbox.StoreConfig{Database: outbox.MySQL, Router: outbox.ToExchange(b.top.Exchange)})
	require.NoError(t, err)
	// A plain INSERT of one key's events. It and the unordered store write
	// one key per transaction: a transaction writing several keys row by
	// row can deadlock with another writing them in the other order
	// (MySQL aborts one, 1213), as documented; an ordered store takes a
	// call's keys in sorted order first.
	raw := func(ctx context.Context, tx *sql.Tx, evts ...outbox.Event) error {
		q := "INSERT INTO outbox (id, event_type, event_key, exchange, routing_key, payload, headers) VALUES "
		var bind []any
		for i, e := range evts {
			if i > 0 {
				q += ","
			}
			q += "(uuid(), ?, ?, ?, ?, ?, '{}')"
			bind = append(bind, e.Type, e.Key, b.top.Exchange, e.Type, e.Payload)
		}
		_, err := tx.ExecContext(ctx, q, bind...)
		return err
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			add := b.store.Add
			switch w {
			case 1:
				add = unordered.Add
			case 2:
				add = func(ctx context.Context, tx outbox.Execer, evts ...outbox.Event) error {
					return raw(ctx, tx.(*sql.Tx), evts...)
				}
			}
			for i := 0; i < total/writers; {
				tx, err := b.db.BeginTx(ctx, nil)
				if !assertNoError(t, err) {
					return
				}
				var evts []outbox.Event
				key := rand.IntN(keys)
				for j := 0; j < 1+rand.IntN(8) && i < total/writers; j++ {
					if w == 0 { // the ordered store's: several keys a call
						key = rand.IntN(keys)
					}
					evts = append(evts, outbox.Event{Type: "order.changed", Key: fmt.Sprint("order-", key), Payload: []byte(fmt.Sprint(w, "/", i))})
					i++
				}
				if !assertNoError(t, add(ctx, tx, evts...)) || !assertNoError(t, tx.Commit()) {
					_ = tx.Rollback()
					return
				}
			}
		}()
	}

	require.Eventually(t, func() bool { return b.consumer.Distinct() >= total/4 }, time.Minute, 5*time.Millisecond)
	kill()
	held := dbtest.Count(t, b.db, "SELECT count(*) FROM outbox WHERE claim_token IS NOT NULL AND published_at IS NULL")
	start(t, relayStore, newPublisher(t, &relay.AMQPConfig{ConnectionName: name}), cfg())
	at := b.consumer.Distinct()
	require.Eventually(t, func() bool { return b.consumer.Distinct() >= at+total/10 }, time.Minute, 5*time.Millisecond)
	stops[0]()
	start(t, relayStore, newPublisher(t, &relay.AMQPConfig{ConnectionName: name}), cfg())
	closes := 0
	for round := 1; round <= 2; round++ {
		at := b.consumer.Distinct()
		require.Eventually(t, func() bool { return b.consumer.Distinct() >= at+total/8 || b.pending(t) == 0 }, time.Minute, 5*time.Millisecond)
		closes += amqptest.CloseNamedConnections(t, name)
	}
	wg.Wait()
	// The writers are done: every other session of the database is a
	// relay's.
	killed := killSessions(t, b.db)
	t.Cleanup(func() {
		if t.Failed() {
			dumpPending(t, b.db)
			rows := mysqlIDs(t, b.db, "true")
			got := b.consumer.IDs()
			missing := 0
			for id := range rows {
				if got[id] == 0 {
					missing++
					if missing < 5 {
						var seq int64
						var pub, token string
						_ = b.db.QueryRow("SELECT seq, coalesce(CAST(published_at AS CHAR), ''), coalesce(claim_token, '') FROM outbox WHERE id = ?", id).Scan(&seq, &pub, &token)
						t.Logf("missing %s seq=%d published_at=%s token=%s", id, seq, pub, token)
					}
				}
			}
			t.Logf("%d rows, %d delivered distinct, %d missing", len(rows), b.consumer.Distinct(), missing)
		}
	})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == total }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireDelivered(t, b.consumer.IDs(), mysqlIDs(t, b.db, "true"))
	want := mysqlIDsByKey(t, b.db)
	got := log.Keys()
	for key, ids := range want {
		require.Equal(t, ids, got[key], "key %s: first deliveries out of the order of writing, or missing", key)
	}
	t.Logf("%d messages over %d keys by 4 relays: one killed holding %d claimed rows, one shut down, %d broker connections closed, %d database sessions killed; %d duplicates; every key in order",
		total, keys, held, closes, killed, b.consumer.Total()-b.consumer.Distinct())
}

// killSessions kills every session of the test's database but one of
// db's, and returns how many.
func killSessions(t *testing.T, db *sql.DB) int {
	t.Helper()
	ctx := context.Background()
	admin, err := db.Conn(ctx)
	require.NoError(t, err)
	defer admin.Close()
	rows, err := admin.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()`)
	require.NoError(t, err)
	ids, err := scanInts(rows)
	require.NoError(t, err)
	n := 0
	for _, id := range ids {
		if _, err := admin.ExecContext(ctx, "KILL CONNECTION ?", id); err == nil {
			n++
		}
	}
	return n
}

// dumpPending logs the state of the first pending messages, for a failed
// test.
func dumpPending(t *testing.T, db *sql.DB) {
	rows, err := db.Query(`SELECT seq, event_key, ord, held, attempts, parked_at IS NOT NULL, coalesce(claimed_until > UTC_TIMESTAMP(6), FALSE), coalesce(claim_token, '')
FROM outbox WHERE published_at IS NULL ORDER BY seq LIMIT 30`)
	if err != nil {
		t.Logf("dumping pending: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var (
			seq, ord               int64
			key, token             string
			held, parked, inFlight bool
			attempts               int
		)
		if err := rows.Scan(&seq, &key, &ord, &held, &attempts, &parked, &inFlight, &token); err != nil {
			t.Logf("dumping pending: %v", err)
			return
		}
		t.Logf("pending seq=%d key=%s ord=%d held=%v attempts=%d parked=%v in_flight=%v token=%q", seq, key, ord, held, attempts, parked, inFlight, token)
	}
}
