package relay_test

import (
	"context"
	"crypto/tls"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// testBundle is one test's world: its own outbox table, exchange, queue and
// consumer, on the real PostgreSQL and RabbitMQ.
type testBundle struct {
	db       *sql.DB
	store    *outbox.Store
	top      amqptest.Topology
	consumer *amqptest.Consumer
}

func setup(t testing.TB, cfg *outbox.StoreConfig, bindingKeys ...string) *testBundle {
	t.Helper()
	return setupFunc(t, cfg, nil, bindingKeys...)
}

// setupFunc is setup whose consumer also calls fn for every delivery.
func setupFunc(t testing.TB, cfg *outbox.StoreConfig, fn func(amqp.Delivery), bindingKeys ...string) *testBundle {
	t.Helper()
	l := outbox.LayoutRows
	if dbtest.LogLayout() {
		l = outbox.LayoutLog
	}
	return setupOn(t, l, cfg, fn, bindingKeys...)
}

// layouts are PostgreSQL's two layouts, on each of which the relay's fault
// tests run (onEveryLayout), each in every run of the suite; the store's
// semantics are proven on each by package outbox's conformance suite.
// OUTBOX_TEST_LAYOUT=log (make test/log) runs every other test of the
// suite on the log layout too.
var layouts = []outbox.Layout{outbox.LayoutRows, outbox.LayoutLog}

// onEveryLayout runs fn as a parallel subtest on each layout.
func onEveryLayout(t *testing.T, fn func(t *testing.T, l outbox.Layout)) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			fn(t, l)
		})
	}
}

// setupOn is setupFunc on a table of layout l.
func setupOn(t testing.TB, l outbox.Layout, cfg *outbox.StoreConfig, fn func(amqp.Delivery), bindingKeys ...string) *testBundle {
	t.Helper()
	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn, bindingKeys...)
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Table = dbtest.Table(t)
	cfg.Router = outbox.ToExchange(top.Exchange)
	cfg.Logger = dbtest.Logger(t)
	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	if l == outbox.LayoutLog {
		require.NoError(t, store.CreateLogSchemaIfAbsent(context.Background()))
	} else {
		require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	}
	return &testBundle{db: db, store: store, top: top, consumer: amqptest.ConsumeFunc(t, conn, top.Queue, fn)}
}

// write commits n events, perTx to a transaction, and returns their ids.
func (b *testBundle) write(t testing.TB, n, perTx int, event func(i int) outbox.Event) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += perTx {
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		var evts []outbox.Event
		for i := start; i < min(start+perTx, n); i++ {
			evts = append(evts, event(i))
		}
		require.NoError(t, b.store.Add(ctx, tx, evts...))
		require.NoError(t, tx.Commit())
	}
}

func (b *testBundle) ids(t testing.TB, where string) map[string]bool {
	t.Helper()
	q := `SELECT id FROM "` + b.store.Table() + `"`
	if where != "" {
		q += " WHERE " + where
	}
	rows, err := b.db.QueryContext(context.Background(), q)
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

func (b *testBundle) count(t testing.TB, where string) int64 {
	t.Helper()
	return dbtest.Count(t, b.db, `SELECT count(*) FROM `+b.messages(t)+` WHERE `+where)
}

// messages names the relation that shows every message with its state:
// the table itself in the rows layout, its _messages view in the log
// layout.
func (b *testBundle) messages(t testing.TB) string {
	t.Helper()
	l, err := b.store.Layout(context.Background())
	require.NoError(t, err)
	if l == outbox.LayoutLog {
		return `"` + b.store.Table() + `_messages"`
	}
	return `"` + b.store.Table() + `"`
}

func (b *testBundle) pending(t testing.TB) int64 {
	t.Helper()
	n, err := b.store.Pending(context.Background())
	require.NoError(t, err)
	return n
}

// awaitDrained waits until nothing is pending, for as long as the count
// keeps going down: it fails only when it stays put for stall. A backlog
// published one broker round trip at a time (a hot key in ordered mode)
// takes as long as the machine makes it, and a fixed deadline would time
// it, not the relay.
func (b *testBundle) awaitDrained(t testing.TB, stall time.Duration) {
	t.Helper()
	last, since := b.pending(t), time.Now()
	for last > 0 {
		time.Sleep(10 * time.Millisecond)
		n := b.pending(t)
		if n < last {
			last, since = n, time.Now()
		}
		if time.Since(since) > stall {
			t.Fatalf("%d message(s) pending, none published for %s", last, stall)
		}
	}
}

// requireDelivered fails the test unless every wanted id was delivered.
// (Not require.Contains in a loop: on a map it compares every key, which
// took a minute for 10,000 ids under the race detector.)
func requireDelivered(t testing.TB, got map[string]int, want map[string]bool) {
	t.Helper()
	var missing []string
	for id := range want {
		if got[id] == 0 {
			missing = append(missing, id)
		}
	}
	require.Empty(t, missing, "%d of %d messages never delivered", len(missing), len(want))
}

func small(i int) outbox.Event {
	return outbox.Event{Type: "order.placed", Key: fmt.Sprintf("order-%d", i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
}

func newPublisher(t testing.TB, cfg *relay.AMQPConfig) *relay.AMQPPublisher {
	t.Helper()
	if cfg == nil {
		cfg = &relay.AMQPConfig{}
	}
	if cfg.URL == "" && len(cfg.URLs) == 0 {
		cfg.URL = amqptest.URL()
	}
	cfg.Logger = dbtest.Logger(t)
	pub, err := relay.NewAMQPPublisher(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return pub
}

// start runs a relay until the test ends (or stop is called) and returns
// the relay and a stop function that waits for Run to return.
func start(t testing.TB, store relay.Store, pub relay.Publisher, cfg *relay.Config) (*relay.Relay, func()) {
	t.Helper()
	if cfg == nil {
		cfg = &relay.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = dbtest.Logger(t)
	}
	r, err := relay.New(store, pub, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return r, stop
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 10_000
	b := setup(t, nil)
	b.write(t, n, 100, small)
	want := b.ids(t, "")
	require.Len(t, want, n)

	r, _ := start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: 500, PollInterval: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)

	got := b.consumer.IDs()
	require.Len(t, got, n)
	requireDelivered(t, got, want)
	require.Equal(t, n, b.consumer.Total(), "no duplicates in a run without faults")
	require.EqualValues(t, n, r.Stats().Published)

	d := b.consumer.Last()
	require.True(t, want[d.MessageId], "message id is the outbox id")
	require.Equal(t, "order.placed", d.Type)
	require.Equal(t, outbox.ContentTypeDefault, d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, "order.placed", d.RoutingKey)
	require.Regexp(t, `^order-\d+$`, d.Headers[relay.KeyHeader])
	require.WithinDuration(t, time.Now(), d.Timestamp, 5*time.Minute)
}

func TestUnroutableMessageFailsAndParks(t *testing.T) {
	onEveryLayout(t, testUnroutableMessageFailsAndParks)
}

func testUnroutableMessageFailsAndParks(t *testing.T, l outbox.Layout) {
	b := setupOn(t, l, &outbox.StoreConfig{MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 }}, nil, "routed.#")
	b.write(t, 20, 20, func(i int) outbox.Event {
		if i == 7 {
			return outbox.Event{Type: "routed.odd", RoutingKey: "nowhere.at.all"}
		}
		return outbox.Event{Type: "routed.ok", Payload: []byte("{}")}
	})
	start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond})

	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 19 }, 30*time.Second, 20*time.Millisecond)
	var lastError string
	var attempts int
	require.NoError(t, b.db.QueryRow(`SELECT last_error, attempts FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&lastError, &attempts))
	require.Contains(t, lastError, "unroutable")
	require.Contains(t, lastError, `routing key "nowhere.at.all"`)
	require.Equal(t, 3, attempts)
	require.EqualValues(t, 1, b.count(t, "published_at IS NULL"), "the unroutable message is never marked published")
	require.EqualValues(t, 0, b.count(t, "published_at IS NOT NULL AND attempts > 0"))

	// More work after the failures still flows.
	b.write(t, 5, 5, func(int) outbox.Event { return outbox.Event{Type: "routed.more"} })
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 24 }, 30*time.Second, 20*time.Millisecond)
}

func TestMissingExchangeFailsAndChannelRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
	missing := amqptest.Name(t, "missing")
	b.write(t, 30, 30, func(i int) outbox.Event {
		if i == 10 {
			return outbox.Event{Type: "lost.event", Exchange: missing}
		}
		return small(i)
	})
	r, _ := start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond})

	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 29 }, 30*time.Second, 20*time.Millisecond)
	var lastError string
	require.NoError(t, b.db.QueryRow(`SELECT last_error FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&lastError))
	require.Contains(t, lastError, fmt.Sprintf("exchange %q does not exist", missing))
	require.EqualValues(t, 0, b.count(t, "published_at IS NOT NULL AND attempts > 0"),
		"messages that shared the closed channel are published again, not failed")
	// The relay counts a failure after MarkFailed returns: the parked row
	// is visible before the second count.
	require.Eventually(t, func() bool { return r.Stats().Failed >= 2 }, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 2, r.Stats().Failed, "only the message to the missing exchange counts attempts")

	b.write(t, 10, 10, small)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 39 }, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 2, r.Stats().Failed, "the parked message and the later ones count no more failures")
}

func TestConnectionCutMidStream(t *testing.T) { onEveryLayout(t, testConnectionCutMidStream) }

func testConnectionCutMidStream(t *testing.T, l outbox.Layout) {
	const n = 3000
	b := setupOn(t, l, nil, nil)
	b.write(t, n, 500, small)
	proxy := amqptest.NewProxy(t)
	r, _ := start(t, b.store, newPublisher(t, &relay.AMQPConfig{URL: proxy.URL()}),
		&relay.Config{BatchSize: 50, PollInterval: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond})

	// Cut the connection three times while messages are flowing.
	for _, at := range []int{500, 1200, 2000} {
		require.Eventually(t, func() bool { return b.consumer.Distinct() >= at }, time.Minute, 5*time.Millisecond)
		proxy.Cut()
	}
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, proxy.Cuts())
	require.EqualValues(t, 0, b.count(t, "attempts > 0"), "an outage burns no attempts")
	t.Logf("delivered %d distinct, %d deliveries (%d duplicates); relay stats %+v",
		b.consumer.Distinct(), b.consumer.Total(), b.consumer.Total()-b.consumer.Distinct(), r.Stats())
}

func TestBrokerClosesConnection(t *testing.T) { onEveryLayout(t, testBrokerClosesConnection) }

func testBrokerClosesConnection(t *testing.T, l outbox.Layout) {
	b := setupOn(t, l, nil, nil)
	b.write(t, 200, 100, small)
	name := amqptest.Name(t, "relay")
	start(t, b.store, newPublisher(t, &relay.AMQPConfig{ConnectionName: name}),
		&relay.Config{PollInterval: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 200 }, time.Minute, 5*time.Millisecond)

	// The broker closes the relay's connection (320 CONNECTION_FORCED), as
	// an operator or a node shutting down would; the relay must notice and
	// come back for the next messages.
	for round := 1; round <= 2; round++ {
		require.GreaterOrEqual(t, amqptest.CloseNamedConnections(t, name), 1, "round %d", round) // one per lane that has published
		b.write(t, 200, 100, small)
		require.Eventually(t, func() bool { return b.consumer.Distinct() == 200*(round+1) }, time.Minute, 20*time.Millisecond)
	}
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 0, b.count(t, "attempts > 0"), "a connection the broker closed burns no attempts")
}

func TestTwoRelaysOneTable(t *testing.T) { onEveryLayout(t, testTwoRelaysOneTable) }

func testTwoRelaysOneTable(t *testing.T, l outbox.Layout) {
	const n = 5000
	b := setupOn(t, l, nil, nil)
	b.write(t, n, 250, small)
	other, err := outbox.NewStore(dbtest.NewDB(t), &outbox.StoreConfig{Table: b.store.Table(), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	cfg := func() *relay.Config { return &relay.Config{BatchSize: 100, PollInterval: 10 * time.Millisecond} }
	r1, _ := start(t, b.store, newPublisher(t, nil), cfg())
	r2, _ := start(t, other, newPublisher(t, nil), cfg())

	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, n, b.consumer.Total(), "no message published twice while leases hold")
	require.Eventually(t, func() bool { return r1.Stats().Published+r2.Stats().Published == n }, 10*time.Second, 10*time.Millisecond)
	s1, s2 := r1.Stats(), r2.Stats()
	require.Positive(t, s1.Published, "both relays worked")
	require.Positive(t, s2.Published, "both relays worked")
	require.Zero(t, s1.LeasesLost+s2.LeasesLost)
}

// neverConfirms is a broker that takes messages and never confirms them.
type neverConfirms struct{ calls chan int }

func (p neverConfirms) Publish(ctx context.Context, msgs []outbox.Message) []error {
	p.calls <- len(msgs)
	<-ctx.Done()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = &relay.PublishError{ID: m.ID, Reason: "no confirm", BrokerFault: true, Err: ctx.Err()}
	}
	return errs
}

func (neverConfirms) Close() error { return nil }

func TestGracefulShutdownReleasesClaims(t *testing.T) {
	onEveryLayout(t, testGracefulShutdownReleasesClaims)
}

func testGracefulShutdownReleasesClaims(t *testing.T, l outbox.Layout) {
	const n = 40
	b := setupOn(t, l, nil, nil)
	b.write(t, n, n, small)
	stuck := neverConfirms{calls: make(chan int, 1)}
	first, stopFirst := start(t, b.store, stuck, &relay.Config{BatchSize: n, Lease: time.Hour, ShutdownTimeout: 100 * time.Millisecond})
	require.Equal(t, n, <-stuck.calls)
	require.EqualValues(t, n, b.count(t, "claimed_until > now() + interval '50 minutes'"), "claimed for an hour")

	stopFirst()
	require.EqualValues(t, n, first.Stats().Released)
	require.EqualValues(t, 0, b.count(t, "claim_token IS NOT NULL OR attempts > 0"), "released without an attempt")

	// A second relay takes the batch long before the hour-long lease would end.
	start(t, b.store, newPublisher(t, nil), &relay.Config{Lease: time.Hour})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
}

func TestOversizedMessage(t *testing.T) {
	t.Parallel()

	t.Run("OverTheConfiguredLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
		b.write(t, 10, 10, func(i int) outbox.Event {
			if i == 3 {
				return outbox.Event{Type: "big.one", Payload: make([]byte, 100<<10)}
			}
			return small(i)
		})
		start(t, b.store, newPublisher(t, &relay.AMQPConfig{MaxMessageSize: 64 << 10}), &relay.Config{PollInterval: 10 * time.Millisecond})
		require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool { return b.consumer.Distinct() == 9 }, 30*time.Second, 20*time.Millisecond)
		var lastError string
		require.NoError(t, b.db.QueryRow(`SELECT last_error FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&lastError))
		require.Contains(t, lastError, "message body is 102400 bytes, larger than the 65536 bytes the broker accepts")
	})

	t.Run("OverTheBrokersLimit", func(t *testing.T) {
		t.Parallel()
		// The broker's own limit, lowered for channels opened from now on;
		// other tests send far smaller messages.
		amqptest.SetMaxMessageSize(t, 1<<20)
		b := setup(t, &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
		b.write(t, 10, 10, func(i int) outbox.Event {
			if i == 3 {
				return outbox.Event{Type: "big.one", Payload: make([]byte, 2<<20)}
			}
			return small(i)
		})
		start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond})
		require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool { return b.consumer.Distinct() == 9 }, 30*time.Second, 20*time.Millisecond)
		var lastError string
		require.NoError(t, b.db.QueryRow(`SELECT last_error FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&lastError))
		require.Contains(t, lastError, "larger than the 1048576 bytes the broker accepts (its max_message_size, learned from a refusal)")
		require.EqualValues(t, 0, b.count(t, "published_at IS NOT NULL AND attempts > 0"))
	})
}

func TestPublisherErrorsNeverShowCredentials(t *testing.T) {
	t.Parallel()
	_, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: "http://user:s3cret@host/"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	pub := newPublisher(t, &relay.AMQPConfig{URL: "amqp://guest:s3cret@127.0.0.1:5672/", URLs: []string{"amqp://u:s3cret@127.0.0.1:1/"}, DialTimeout: time.Second})
	errs := pub.Publish(context.Background(), []outbox.Message{{ID: "m1", RoutingKey: "x"}})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], relay.ErrBrokerUnavailable)
	require.NotContains(t, errs[0].Error(), "s3cret")
	require.Contains(t, errs[0].Error(), "amqp://127.0.0.1:5672/", "says which node failed")
	require.Contains(t, errs[0].Error(), "amqp://127.0.0.1:1/", "tries every node")
}

func TestClusterNodesTriedInTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, 10, 10, small)
	// The first node is down; the second is the real broker.
	pub := newPublisher(t, &relay.AMQPConfig{URLs: []string{"amqp://guest:guest@127.0.0.1:1/", amqptest.URL()}, DialTimeout: time.Second})
	start(t, b.store, pub, &relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 10 }, 30*time.Second, 20*time.Millisecond)
}

func TestAMQPS(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, 20, 20, small)
	url, roots := amqptest.TLSProxy(t)

	// Without trusting the proxy's certificate the connection is refused...
	untrusting := newPublisher(t, &relay.AMQPConfig{URL: url, DialTimeout: 2 * time.Second})
	errs := untrusting.Publish(context.Background(), []outbox.Message{{ID: "m1", RoutingKey: "x"}})
	require.ErrorIs(t, errs[0], relay.ErrBrokerUnavailable)
	require.ErrorContains(t, errs[0], "certificate")

	// ...and with TLSConfig it carries the messages.
	start(t, b.store, newPublisher(t, &relay.AMQPConfig{URL: url, TLSConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}),
		&relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 20 }, 30*time.Second, 20*time.Millisecond)
}

func TestStalledBroker(t *testing.T) {
	t.Parallel()
	const n = 600
	b := setup(t, nil)
	b.write(t, n, 100, small)
	proxy := amqptest.NewProxy(t)
	r, _ := start(t, b.store, newPublisher(t, &relay.AMQPConfig{URL: proxy.URL(), DialTimeout: time.Second}), &relay.Config{
		BatchSize: 50, PollInterval: 10 * time.Millisecond, PublishTimeout: 500 * time.Millisecond, Lease: 5 * time.Second, BackoffMax: 200 * time.Millisecond,
	})
	require.Eventually(t, func() bool { return b.consumer.Distinct() >= 100 }, time.Minute, 5*time.Millisecond)

	// The broker stops answering: no confirm arrives, nothing may be marked
	// published, and the relay must not hang.
	proxy.Stall()
	require.Eventually(t, func() bool { return r.Stats().Released > 0 }, 30*time.Second, 10*time.Millisecond,
		"unconfirmed messages are released once PublishTimeout passes")
	stalledAt := r.Stats()
	proxy.Unstall()

	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 0, b.count(t, "attempts > 0"), "a stalled broker burns no attempts")
	t.Logf("stats when stalled %+v, at the end %+v; %d duplicates", stalledAt, r.Stats(), b.consumer.Total()-b.consumer.Distinct())
}

// TestUnsendableRowDoesNotBlock: a row no AMQP client can send (written
// around Store.Add, which refuses it) fails and parks instead of failing the
// batch over and over.
func TestUnsendableRowDoesNotBlock(t *testing.T) {
	t.Parallel()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
	b.write(t, 10, 10, small)
	_, err := b.db.Exec(`INSERT INTO "`+b.store.Table()+`" (id, event_type, exchange, routing_key, payload)
		VALUES ('01a22f00-0000-7000-8000-000000000001', 'bad', $1, $2, '\x7b7d')`, b.top.Exchange, strings.Repeat("k", 300))
	require.NoError(t, err)
	b.write(t, 10, 10, small)
	start(t, b.store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond})
	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 20 }, 30*time.Second, 20*time.Millisecond)
	var lastError string
	require.NoError(t, b.db.QueryRow(`SELECT last_error FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&lastError))
	require.Equal(t, "the routing key is 300 bytes; AMQP allows at most 255", lastError)
}

// TestLargeBatchWithUnroutable publishes a batch larger than the confirm
// window with unroutable messages spread over it: every one of them must be
// reported, none marked published.
func TestLargeBatchWithUnroutable(t *testing.T) {
	t.Parallel()
	const n = 2500
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 1}, "routed.#")
	b.write(t, n, 500, func(i int) outbox.Event {
		if i%250 == 7 {
			return outbox.Event{Type: "routed.lost", RoutingKey: "nowhere"}
		}
		return outbox.Event{Type: "routed.ok"}
	})
	r, _ := start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: n, Lease: time.Minute, PublishTimeout: 30 * time.Second})
	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 10 }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n-10 }, time.Minute, 20*time.Millisecond)
	require.EqualValues(t, 0, b.count(t, "routing_key = 'nowhere' AND published_at IS NOT NULL"))
	require.EqualValues(t, 10, b.count(t, "routing_key = 'nowhere' AND last_error LIKE 'unroutable%'"))
	require.Eventually(t, func() bool { return r.Stats().Published == n-10 }, 10*time.Second, 10*time.Millisecond)
}
