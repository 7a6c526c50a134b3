package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
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

// eachLayout runs test, in parallel, on each storage layout that the
// assertions must read.
func eachLayout(t *testing.T, test func(t *testing.T, layout string)) {
	t.Parallel()
	for _, layout := range []string{"rows", "log"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			test(t, layout)
		})
	}
}

// begin opens a transaction that the test rolls back unless it commits.
func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// newStoreOn creates a store on a fresh table of the given layout.
func newStoreOn(t *testing.T, layout string, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store) {
	t.Helper()
	db := dbtest.DB(t)
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Table, cfg.Logger = dbtest.Table(t), dbtest.Logger(t)
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	if layout == "log" {
		require.NoError(t, store.CreateLogSchemaIfAbsent(context.Background()))
	} else {
		require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	}
	l, err := store.Layout(context.Background())
	require.NoError(t, err)
	require.Equal(t, layout, l.String())
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
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		db, store := newStoreOn(t, layout, &outbox.StoreConfig{Router: outbox.ToExchange("shop")})
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
	})
}

// Issue 38, item 2: the assertions read a table of either layout (the log
// layout, the default, through its _messages view), schema-qualified or
// not, through database/sql and pgx, and tell published from pending.
func TestRequireEventOnEveryLayout(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"rows", "log"} {
		for _, qualified := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/qualified=%v", layout, qualified), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := dbtest.DB(t)
				table := dbtest.Table(t)
				if qualified {
					table = dbtest.Schema(t) + ".outbox"
				}
				store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
				require.NoError(t, err)
				create := store.CreateSchemaIfAbsent
				if layout == "rows" {
					create = store.CreateRowsSchemaIfAbsent
				}
				require.NoError(t, create(ctx))
				l, err := store.Layout(ctx)
				require.NoError(t, err)
				require.Equal(t, layout, l.String())

				pool, err := pgxpool.New(ctx, dbtest.URL())
				require.NoError(t, err)
				defer pool.Close()
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx) //nolint:errcheck
				require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "order.placed", Key: "order-7"}))
				e := outboxtest.RequireEvent(t, tx, table, outboxtest.Match{Type: "order.placed", Key: "order-7"})
				require.False(t, e.Published)
				outboxtest.RequireNoEvent(t, db, table, outboxtest.Match{})
				require.NoError(t, tx.Commit(ctx))

				n, err := outboxtest.Drain(ctx, store, &outboxtest.Publisher{})
				require.NoError(t, err)
				require.Equal(t, 1, n)
				e = outboxtest.RequireEvent(t, db, table, outboxtest.Match{Type: "order.placed"})
				require.True(t, e.Published)
				require.True(t, outboxtest.RequireEvent(t, pool, table, outboxtest.Match{Key: "order-7"}).Published)
			})
		}
	}
}

// Issue 22, item 1: the assertions read through pgx too.
func TestRequireEventThroughPgx(t *testing.T) {
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		_, store := newStoreOn(t, layout, nil)
		pool, err := pgxpool.New(ctx, dbtest.URL())
		require.NoError(t, err)
		defer pool.Close()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		require.NoError(t, store.Add(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "order.placed", Key: "order-7"}))
		outboxtest.RequireEvent(t, tx, store.Table(), outboxtest.Match{Type: "order.placed", Key: "order-7"})
		outboxtest.RequireNoEvent(t, pool, store.Table(), outboxtest.Match{})
	})
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
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		db, store := newStoreOn(t, layout, &outbox.StoreConfig{Router: outbox.ToExchange("shop"), MaxAttempts: 1})
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
	})
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
	got, err := outboxtest.Deliver(ctx, ib, amqp.Delivery{MessageId: "order-paid-9", Body: []byte(`{}`)}, charge, 3)
	require.NoError(t, err)
	require.Equal(t, []outboxtest.Delivered{
		{Outcome: inbox.Handled, Settled: "ack"}, {Outcome: inbox.Duplicate, Settled: "ack"}, {Outcome: inbox.Duplicate, Settled: "ack"},
	}, got)
	require.EqualValues(t, 1, dbtest.Count(t, db, `SELECT count(*) FROM "`+table+`_charges"`))

	bad, err := outboxtest.Deliver(ctx, ib, amqp.Delivery{MessageId: "order-paid-10"}, func(context.Context, *sql.Tx, *amqp.Delivery) error {
		return inbox.Permanent(errors.New("no such order"))
	}, 1)
	require.NoError(t, err)
	require.Equal(t, inbox.DeadLettered, bad[0].Outcome)
	require.Equal(t, "reject", bad[0].Settled)
	require.True(t, strings.Contains(bad[0].Err.Error(), "no such order"))
}

// Issue 47, item 3: on the log layout Find, Events and the Require
// functions failed (column "published_at" does not exist), and inside the
// test's transaction the failure aborted it. They read the table's events
// with their state, and a read that cannot succeed (a missing table) is
// refused before any statement can fail, so the transaction goes on.
func TestEventsOnEveryLayoutKeepTheTransaction(t *testing.T) {
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		db, store := newStoreOn(t, layout, nil)
		table := store.Table()
		tx := begin(t, db)
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.placed", Key: "order-1"}))
		outboxtest.RequireEvent(t, tx, table, outboxtest.Match{Type: "order.placed"})

		_, err := outboxtest.Find(ctx, tx, table+"_nope", outboxtest.Match{})
		require.ErrorContains(t, err, "table "+table+"_nope does not exist")
		_, err = outboxtest.Find(ctx, tx, table+"_seq", outboxtest.Match{}) // a sequence of the log layout, or nothing
		require.Error(t, err)
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.paid", Key: "order-1"}), "the transaction was not aborted")
		got := outboxtest.RequireEvents(t, tx, table, outboxtest.Match{Key: "order-1"}, 2)
		require.Equal(t, []string{"order.placed", "order.paid"}, []string{got[0].Type, got[1].Type}, "in the order they were written")
		require.NoError(t, tx.Commit())

		n, err := outboxtest.Drain(ctx, store, &outboxtest.Publisher{})
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for _, e := range outboxtest.Events(t, db, table) {
			require.True(t, e.Published, "%s is published", e.Type)
		}
		msg := failure(func(tb testing.TB) { outboxtest.RequireNoEvent(tb, db, table, outboxtest.Match{Type: "order.paid"}) })
		require.Contains(t, msg, `2. order.paid key="order-1" exchange="" routing_key="order.paid" published`)
	})
}

// Issue 47, item 3: payloads were compared as float64, so a large integer
// matched its neighbour (…891 matched …890); "null" matched every payload;
// a header asked for with the value "" matched events without it.
func TestMatchIsExact(t *testing.T) {
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		db, store := newStoreOn(t, layout, nil)
		table := store.Table()
		tx := begin(t, db)
		require.NoError(t, store.Add(ctx, tx,
			outbox.Event{Type: "big", Payload: []byte(`{"id": 12345678901234567891, "price": 0.1000000000000000000001, "n": 2}`)},
			outbox.Event{Type: "null", Payload: []byte(`null`)},
			outbox.Event{Type: "empty-object", Payload: []byte(`{}`)},
			outbox.Event{Type: "no-payload"},
			outbox.Event{Type: "with-header", Headers: map[string]string{"trace": ""}},
			outbox.Event{Type: "other-header", Headers: map[string]string{"tenant": "acme"}}))

		types := func(m outboxtest.Match) []string {
			t.Helper()
			got, err := outboxtest.Find(ctx, tx, table, m)
			require.NoError(t, err)
			out := []string{}
			for _, e := range got {
				out = append(out, e.Type)
			}
			return out
		}
		require.Equal(t, []string{"big"}, types(outboxtest.Match{Payload: `{"id": 12345678901234567891}`}))
		require.Empty(t, types(outboxtest.Match{Payload: `{"id": 12345678901234567890}`}), "the neighbour of a large integer")
		require.Empty(t, types(outboxtest.Match{Payload: `{"price": 0.1}`}), "a long fraction")
		require.Equal(t, []string{"big"}, types(outboxtest.Match{Payload: `{"price": 1.000000000000000000001e-1, "n": 2.0}`}), "the same numbers written otherwise")
		require.Equal(t, []string{"null"}, types(outboxtest.Match{Payload: `null`}))
		require.Equal(t, []string{"big", "empty-object"}, types(outboxtest.Match{Payload: `{}`}))
		require.Equal(t, []string{"with-header"}, types(outboxtest.Match{Headers: map[string]string{"trace": ""}}))
		require.Empty(t, types(outboxtest.Match{Headers: map[string]string{"missing": ""}}))
		require.Equal(t, []string{"other-header"}, types(outboxtest.Match{Headers: map[string]string{"tenant": "acme"}}))
		_, err := outboxtest.Find(ctx, tx, table, outboxtest.Match{Payload: `{} {}`})
		require.ErrorContains(t, err, "Match.Payload is not JSON: more than one JSON value")
	})
}

// Issue 47, item 3: Deliver panicked given a negative count or a nil
// inbox; it says what is wrong instead.
func TestDeliverRefusesMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ib, err := inbox.New(dbtest.DB(t), &inbox.Config{Consumer: "billing", Table: dbtest.Table(t), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	h := func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }
	d := amqp.Delivery{MessageId: "evt-1"}
	for _, c := range []struct {
		name  string
		call  func() ([]outboxtest.Delivered, error)
		error string
	}{
		{"negative times", func() ([]outboxtest.Delivered, error) { return outboxtest.Deliver(ctx, ib, d, h, -1) }, "cannot deliver -1 times"},
		{"nil inbox", func() ([]outboxtest.Delivered, error) { return outboxtest.Deliver(ctx, nil, d, h, 1) }, "needs an inbox"},
		{"nil handler", func() ([]outboxtest.Delivered, error) { return outboxtest.Deliver(ctx, ib, d, nil, 1) }, "needs a handler"},
	} {
		got, err := c.call()
		require.ErrorContains(t, err, c.error, c.name)
		require.Nil(t, got, c.name)
	}
	got, err := outboxtest.Deliver(ctx, ib, d, h, 0)
	require.NoError(t, err)
	require.Empty(t, got)
}

// Headers that are not text (a row written by SQL, which the relay parks)
// are shown as their JSON instead of failing every read of the table.
func TestEventsShowHeadersThatAreNotText(t *testing.T) {
	eachLayout(t, func(t *testing.T, layout string) {
		db, store := newStoreOn(t, layout, nil)
		_, err := db.Exec(`INSERT INTO "`+store.Table()+`" (id, event_type, payload, headers) VALUES ($1, 'bad', '\x7b7d', '{"retry": 1, "tenant": "acme"}')`, uuid.NewString())
		require.NoError(t, err)
		e := outboxtest.RequireEvent(t, db, store.Table(), outboxtest.Match{Headers: map[string]string{"retry": "1"}})
		require.Equal(t, map[string]string{"retry": "1", "tenant": "acme"}, e.Headers)
	})
}

// Issue 42: a test asserts a delayed event's NotBefore inside its
// transaction, and runs the relay's work as of a day later without
// sleeping: MakeDue, then Drain publishes it.
func TestDelayedEventAssertedAndMadeDue(t *testing.T) {
	eachLayout(t, func(t *testing.T, layout string) {
		ctx := context.Background()
		db, store := newStoreOn(t, layout, nil)
		tx := begin(t, db)
		tomorrow := time.Now().Add(24 * time.Hour)
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "reminder.due", Key: "order-1", NotBefore: tomorrow}, outbox.Event{Type: "order.placed"}))
		e := outboxtest.RequireEvent(t, tx, store.Table(), outboxtest.Match{Type: "reminder.due"})
		require.WithinDuration(t, tomorrow, e.NotBefore, time.Minute, "due a day later, by the database's clock")
		require.False(t, e.Published)
		require.True(t, outboxtest.RequireEvent(t, tx, store.Table(), outboxtest.Match{Type: "order.placed"}).NotBefore.IsZero())
		require.NoError(t, tx.Commit())

		pub := &outboxtest.Publisher{}
		n, err := outboxtest.Drain(ctx, store, pub)
		require.NoError(t, err)
		require.Equal(t, 1, n, "only the event that is not delayed")
		made, err := outboxtest.MakeDue(ctx, db, store.Table(), time.Hour)
		require.NoError(t, err)
		require.Zero(t, made, "not due within an hour")
		made, err = outboxtest.MakeDue(ctx, db, store.Table(), 25*time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 1, made)
		n, err = outboxtest.Drain(ctx, store, pub)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, "reminder.due", pub.Messages()[1].Type)
		require.True(t, outboxtest.RequireEvent(t, db, store.Table(), outboxtest.Match{Type: "reminder.due"}).Published)
	})
}
