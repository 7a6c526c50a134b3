package outboxotel_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxotel"
	"github.com/acemq/outbox/relay"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// collect returns every metric the reader holds, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func sum(t *testing.T, m metricdata.Metrics) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a sum", m.Name)
	var n int64
	for _, p := range s.DataPoints {
		n += p.Value
	}
	return n
}

// Issue 10, items 1 and 2: what a relay does becomes metrics with units,
// and a store's gauges come from Store.Gauges.
func TestObserverRecordsMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t), MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}, outbox.Event{Type: "c"}))
	require.NoError(t, tx.Commit())
	claimed, err := store.Claim(ctx, 2, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	require.NoError(t, store.MarkFailed(ctx, claimed[1], "NO_ROUTE")) // b parked; a in flight, c ready

	reader := sdkmetric.NewManualReader()
	obs, err := outboxotel.NewObserver(&outboxotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), Store: store})
	require.NoError(t, err)
	defer obs.Close()

	var o relay.Observer = obs
	msg := &outbox.Message{ID: "m"}
	o.Claimed(ctx, 3, 2*time.Millisecond, nil)
	o.Claimed(ctx, 0, time.Millisecond, sql.ErrConnDone)
	o.Published(ctx, 2, 5*time.Millisecond)
	o.Lag(ctx, msg, 1500*time.Millisecond)
	o.Lag(ctx, msg, 3*time.Second)
	o.Failed(ctx, msg, relay.ClassUnroutable, true)
	o.Released(ctx, 4, relay.ReleasedBroker)
	o.LeasesLost(ctx, 1)
	o.Settled(ctx, time.Millisecond, nil)

	got := collect(t, reader)
	require.EqualValues(t, 3, sum(t, got["outbox.messages.claimed"]))
	require.EqualValues(t, 1, sum(t, got["outbox.claim.errors"]))
	require.EqualValues(t, 3, sum(t, got["messaging.client.sent.messages"]), "2 confirmed and 1 failed, with error.type")
	require.EqualValues(t, 1, sum(t, got["outbox.messages.failed"]))
	require.EqualValues(t, 1, sum(t, got["outbox.messages.parked"]))
	require.EqualValues(t, 4, sum(t, got["outbox.messages.released"]))
	require.EqualValues(t, 1, sum(t, got["outbox.leases.lost"]))
	lag := got["outbox.lag"]
	require.Equal(t, "s", lag.Unit)
	h := lag.Data.(metricdata.Histogram[float64])
	require.EqualValues(t, 2, h.DataPoints[0].Count)
	require.InDelta(t, 4.5, h.DataPoints[0].Sum, 0.001)
	for _, name := range []string{"messaging.client.operation.duration", "outbox.claim.duration", "outbox.settle.duration"} {
		require.Equal(t, "s", got[name].Unit, name)
	}

	// Issue 38, item 1: pending counts them all, parked included, and
	// each view counts what it says.
	gauge := func(name string) int64 {
		t.Helper()
		g, ok := got[name].Data.(metricdata.Gauge[int64])
		require.True(t, ok, "%s is an int64 gauge", name)
		return g.DataPoints[0].Value
	}
	require.Equal(t, map[string]int64{"outbox.pending": 3, "outbox.ready": 1, "outbox.in_flight": 1, "outbox.retrying": 0, "outbox.held": 0, "outbox.parked": 1},
		map[string]int64{"outbox.pending": gauge("outbox.pending"), "outbox.ready": gauge("outbox.ready"), "outbox.in_flight": gauge("outbox.in_flight"),
			"outbox.retrying": gauge("outbox.retrying"), "outbox.held": gauge("outbox.held"), "outbox.parked": gauge("outbox.parked")})
	require.Equal(t, "s", got["outbox.oldest_ready.age"].Unit)
	require.EqualValues(t, 0, got["outbox.keys.blocked"].Data.(metricdata.Gauge[int64]).DataPoints[0].Value)
	require.Equal(t, "s", got["outbox.oldest_pending.age"].Unit)

	require.NoError(t, obs.Close())
	require.NotContains(t, collect(t, reader), "outbox.pending", "Close unregisters the gauges")
}

// Issue 12, item 3: the inbox consumer's outcomes become metrics.
func TestInboxObserver(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := outboxotel.NewInboxObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), "billing")
	require.NoError(t, err)
	d := &amqp.Delivery{RoutingKey: "order.placed"}
	obs.Handled(context.Background(), d, inbox.Handled, time.Millisecond, nil)
	obs.Handled(context.Background(), d, inbox.Duplicate, time.Millisecond, nil)
	obs.Handled(context.Background(), d, inbox.DeadLettered, time.Millisecond, errors.New("bad"))
	got := collect(t, reader)
	require.EqualValues(t, 3, sum(t, got["messaging.client.consumed.messages"]))
	require.Equal(t, "s", got["messaging.process.duration"].Unit)
	points := got["messaging.client.consumed.messages"].Data.(metricdata.Sum[int64]).DataPoints
	outcomes := map[string]bool{}
	for _, p := range points {
		v, _ := p.Attributes.Value("outbox.inbox.outcome")
		outcomes[v.AsString()] = true
	}
	require.Equal(t, map[string]bool{"handled": true, "duplicate": true, "dead-lettered": true}, outcomes)
}
