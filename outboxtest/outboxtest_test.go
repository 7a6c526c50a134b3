package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
	"github.com/acemq/outbox/pgxoutbox"
	"github.com/acemq/outbox/relay"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func newStore(t *testing.T, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store) {
	t.Helper()
	db := dbtest.DB(t)
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Table, cfg.Logger = dbtest.Table(t), dbtest.Logger(t)
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(context.Background()))
	return db, store
}

// fatalTB records a Fatalf instead of ending the test, to check what a
// failing assertion says.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f) // Fatalf does not return
}

func failure(f func(tb testing.TB)) (msg string) {
	tb := &fatalTB{}
	defer func() {
		if r := recover(); r != nil {
			msg = r.(*fatalTB).msg
		}
	}()
	f(tb)
	return ""
}

// Issue 22, item 1: an event is asserted inside the test's transaction
// (before its commit) and after it, by type, key, payload subset and
// headers; a failure lists what was recorded.
func TestRequireEventInsideAndAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newStore(t, &outbox.StoreConfig{Router: outbox.ToExchange("shop")})
	table := store.Table()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	evt, err := outbox.JSON("order.placed", "order-42", map[string]any{"total": 4200, "lines": []any{map[string]any{"sku": "a", "qty": 2}}, "note": "x"})
	require.NoError(t, err)
	evt.Headers = map[string]string{"tenant": "acme"}
	require.NoError(t, store.Add(ctx, tx, evt, outbox.Event{Type: "order.audited", Key: "order-42"}))

	e := outboxtest.RequireEvent(t, tx, table, outboxtest.Match{Type: "order.placed", Key: "order-42",
		Payload: `{"total": 4200, "lines": [{"sku": "a"}]}`, Headers: map[string]string{"tenant": "acme"}, Exchange: "shop", RoutingKey: "order.placed"})
	require.False(t, e.Published)
	outboxtest.RequireNoEvent(t, db, table, outboxtest.Match{Type: "order.placed"}) // not committed yet
	outboxtest.RequireEvents(t, tx, table, outboxtest.Match{Key: "order-42"}, 2)
	require.NoError(t, tx.Commit())
	outboxtest.RequireEvent(t, db, table, outboxtest.Match{Type: "order.placed"})

	msg := failure(func(tb testing.TB) {
		outboxtest.RequireEvent(tb, db, table, outboxtest.Match{Type: "order.placed", Payload: `{"total": 99}`})
	})
	require.Contains(t, msg, `want 1 event(s) matching {type="order.placed" payload="{\"total\": 99}"}`)
	require.Contains(t, msg, "found 0; recorded:")
	require.Contains(t, msg, `1. order.placed key="order-42" exchange="shop" routing_key="order.placed" pending payload={"lines":[{"qty":2,"sku":"a"}],"note":"x","total":4200} headers=map[tenant:acme]`)
	require.Contains(t, msg, `2. order.audited key="order-42"`)
	msg = failure(func(tb testing.TB) { outboxtest.RequireNoEvent(tb, db, table, outboxtest.Match{Key: "order-42"}) })
	require.Contains(t, msg, "want no event matching {key=\"order-42\"}")
	msg = failure(func(tb testing.TB) { outboxtest.Events(tb, 42, table) })
	require.Contains(t, msg, "cannot read "+table+" with a int")
	msg = failure(func(tb testing.TB) { outboxtest.RequireEvent(tb, db, table, outboxtest.Match{Payload: "{"}) })
	require.Contains(t, msg, "Match.Payload is not JSON")
}

// Issue 22, item 1: the assertions read through pgx too.
func TestRequireEventThroughPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, store := newStore(t, nil)
	pool, err := pgxpool.New(ctx, dbtest.URL())
	require.NoError(t, err)
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "order.placed", Key: "order-7"}))
	outboxtest.RequireEvent(t, tx, store.Table(), outboxtest.Match{Type: "order.placed", Key: "order-7"})
	outboxtest.RequireNoEvent(t, pool, store.Table(), outboxtest.Match{})
}

func TestContains(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		got, want string
		ok        bool
	}{
		{`{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"c":2}}`, true},
		{`{"a":1}`, `{"a":2}`, false},
		{`{"a":[1,2]}`, `{"a":[1,2]}`, true},
		{`{"a":[1,2]}`, `{"a":[1]}`, false},
		{`{"a":"x"}`, `{"b":null}`, false},
		{`[{"a":1,"b":2}]`, `[{"a":1}]`, true},
	} {
		var got, want any
		require.NoError(t, jsonUnmarshal(tc.got, &got))
		require.NoError(t, jsonUnmarshal(tc.want, &want))
		require.Equal(t, tc.ok, outboxtest.Contains(got, want), "%s ⊇ %s", tc.got, tc.want)
	}
}

// Issue 22, item 1: Drain does the relay's work without a broker, into a
// publisher that records the AMQP properties the real one would set; a
// failure counts an attempt, as the relay's would.
func TestDrainRecordsWhatTheRelayWouldSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := newStore(t, &outbox.StoreConfig{Router: outbox.ToExchange("shop"), MaxAttempts: 1})
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := store.AddIDs(ctx, tx,
		outbox.Event{Type: "order.placed", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"tenant": "acme"}},
		outbox.Event{Type: "order.unroutable", Key: "order-2"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if m.EventType == "order.unroutable" {
			return errors.New("unroutable: no queue bound")
		}
		return nil
	}}
	n, err := outboxtest.Drain(ctx, store, pub)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := pub.Messages()
	require.Len(t, got, 1)
	m := got[0]
	require.Equal(t, "shop", m.Exchange)
	require.Equal(t, "order.placed", m.RoutingKey)
	require.Equal(t, ids[0], m.MessageId)
	require.Equal(t, "order.placed", m.Type)
	require.Equal(t, amqp.Persistent, m.DeliveryMode)
	require.Equal(t, "application/json", m.ContentType)
	require.Equal(t, amqp.Table{"tenant": "acme", relay.KeyHeader: "order-1"}, m.Headers)
	require.JSONEq(t, `{"n":1}`, string(m.Body))
	require.False(t, m.Timestamp.IsZero())
	outboxtest.RequireEvent(t, db, store.Table(), outboxtest.Match{Type: "order.placed"})
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, 0, 1}, [3]int64{st.Pending, st.Ready, st.Parked}, "the failure parked its message (MaxAttempts 1), still pending")
	n, err = outboxtest.Drain(ctx, store, pub)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to claim")
}

// Issue 22, item 1: a delivery handed to the inbox three times, as a broker
// may, has its effect once.
func TestDeliverAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: table, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	_, err = db.Exec(`CREATE TABLE "` + table + `_charges" (message_id text)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE "` + table + `_charges"`) })
	charge := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`_charges" VALUES ($1)`, d.MessageId)
		return err
	}
	got := outboxtest.Deliver(ctx, ib, amqp.Delivery{MessageId: "order-paid-9", Body: []byte(`{}`)}, charge, 3)
	require.Equal(t, []outboxtest.Delivered{
		{Outcome: inbox.Handled, Settled: "ack"}, {Outcome: inbox.Duplicate, Settled: "ack"}, {Outcome: inbox.Duplicate, Settled: "ack"},
	}, got)
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`_charges"`))

	bad := outboxtest.Deliver(ctx, ib, amqp.Delivery{MessageId: "order-paid-10"}, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		return inbox.Permanent(errors.New("no such order"))
	}, 1)
	require.Equal(t, inbox.DeadLettered, bad[0].Outcome)
	require.Equal(t, "reject", bad[0].Settled)
	require.True(t, strings.Contains(bad[0].Err.Error(), "no such order"))
}
