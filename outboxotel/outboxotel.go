// Package outboxotel reports what outbox relays do as OpenTelemetry
// metrics: an implementation of relay.Observer, and gauges of an outbox
// table that stay cheap however large it grows.
//
//	obs, err := outboxotel.NewObserver(&outboxotel.Config{Store: store}) // global MeterProvider
//	if err != nil { … }
//	defer obs.Close()
//	r, err := relay.New(store, pub, &relay.Config{Observer: obs})
//
// For traces, Headers carries the writer's trace context into the events,
// and Tracing wraps the relay's publisher so that each message is
// published in a span of the writer's trace.
//
// Instrument names follow OpenTelemetry's messaging semantic conventions
// where one exists (messaging.client.sent.messages,
// messaging.client.operation.duration) and are outbox.* otherwise; every
// instrument has its unit. `outbox relay --metrics-addr` serves them in
// Prometheus' text format.
//
// This package is the only one of the module that imports OpenTelemetry:
// packages outbox and relay offer the seam (relay.Observer,
// outbox.Store.Gauges) and stay free of it.
package outboxotel

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// ScopeName is the instrumentation scope of the meters this package makes.
const ScopeName = "github.com/acemq/outbox/outboxotel"

// Config configures an Observer. The zero value (and nil) gives the
// defaults.
type Config struct {
	// MeterProvider makes the instruments. Defaults to the global one
	// (otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider

	// Store, when set, adds the gauges of the table's messages by state,
	// which mean what Store.Gauges' fields do: outbox.pending (every
	// message not yet published, parked ones included), outbox.ready
	// (claimable now), outbox.in_flight, outbox.retrying, outbox.held,
	// outbox.parked, outbox.oldest_pending.age, outbox.oldest_ready.age and
	// outbox.keys.blocked, read on every collection with Store.Gauges: from
	// partial indexes, counts stopping at GaugesLimit. Alert on what should
	// be moving with outbox.ready and outbox.oldest_ready.age: they leave
	// parked messages out (outbox.parked has its own alert).
	Store *outbox.Store

	// GaugesLimit is where the pending and parked counts stop. Defaults to
	// outbox.GaugesLimitDefault (100,000).
	GaugesLimit int64

	// System is the messaging.system attribute. Defaults to "rabbitmq".
	System string

	// Unroutable, when set, adds the counter outbox.unroutable, by
	// outbox.unroutable.action (dropped, diverted): pass an
	// AMQPPublisher's Unroutable method.
	Unroutable func() relay.UnroutableStats

	// Ready, when set, adds the gauge outbox.relay.ready: 1 while it
	// returns true, 0 otherwise. `outbox relay --metrics-addr` sets it to
	// what /readyz answers.
	Ready func() bool
}

// Observer is a relay.Observer that records OpenTelemetry metrics. It is
// safe for concurrent use. Close unregisters its gauges.
type Observer struct {
	attrs     metric.MeasurementOption
	publish   metric.MeasurementOption
	sent      metric.Int64Counter
	opDur     metric.Float64Histogram
	claimed   metric.Int64Counter
	claimDur  metric.Float64Histogram
	claimErrs metric.Int64Counter
	lag       metric.Float64Histogram
	failed    metric.Int64Counter
	parked    metric.Int64Counter
	released  metric.Int64Counter
	lost      metric.Int64Counter
	settleDur metric.Float64Histogram
	reg       metric.Registration
}

var _ relay.Observer = (*Observer)(nil)

// durations are histogram boundaries in seconds, from 0.5ms to 5min.
var durations = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// NewObserver makes the instruments and, with Config.Store, registers the
// gauges' callback.
func NewObserver(cfg *Config) (*Observer, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	common := []attribute.KeyValue{attribute.String("messaging.system", cmp.Or(cfg.System, "rabbitmq"))}
	if cfg.Store != nil {
		common = append(common, attribute.String("outbox.table", cfg.Store.Table()))
	}
	o := &Observer{
		attrs:   metric.WithAttributes(common...),
		publish: metric.WithAttributes(append(common, attribute.String("messaging.operation.name", "publish"), attribute.String("messaging.operation.type", "send"))...),
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(durations...))
		errs = append(errs, err)
		return h
	}
	o.sent = counter("messaging.client.sent.messages", "{message}", "Messages the relay published: confirmed by the broker, or failed with error.type")
	o.opDur = histogram("messaging.client.operation.duration", "Time to publish a batch, the broker's confirms included")
	o.claimed = counter("outbox.messages.claimed", "{message}", "Messages claimed from the outbox table")
	o.claimDur = histogram("outbox.claim.duration", "Time one claim took")
	o.claimErrs = counter("outbox.claim.errors", "{error}", "Claims that failed")
	o.lag = histogram("outbox.lag", "Time from a message's created_at (the writing transaction's start, database clock) to the broker's confirm")
	o.failed = counter("outbox.messages.failed", "{message}", "Failed attempts counted against a message, by error.type")
	o.parked = counter("outbox.messages.parked", "{message}", "Messages parked after their last attempt")
	o.released = counter("outbox.messages.released", "{message}", "Messages given back without an attempt, by outbox.release.reason (broker, shutdown, order: not sent, in ordered mode, because an earlier message of its key in the batch was not confirmed)")
	o.lost = counter("outbox.leases.lost", "{message}", "Messages whose claim had passed to another relay when settled")
	o.settleDur = histogram("outbox.settle.duration", "Time to mark a batch published or failed and release the rest")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Store != nil || cfg.Ready != nil || cfg.Unroutable != nil {
		if err := o.gauges(m, cfg.Store, cmp.Or(cfg.GaugesLimit, outbox.GaugesLimitDefault), cfg.Ready, cfg.Unroutable); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (o *Observer) gauges(m metric.Meter, store *outbox.Store, limit int64, ready func() bool, unroutable func() relay.UnroutableStats) error {
	var errs []error
	intGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	ageGauge := func(name, desc string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	pending := intGauge("outbox.pending", "{message}",
		"Messages waiting to be published, all of them (ready, in flight, retrying, held, parked and scheduled: as Store.Pending and outbox status), counted up to a limit (100,000 by default) from partial indexes: a value at the limit means at least that many")
	readyMsgs := intGauge("outbox.ready", "{message}",
		"Messages a relay may claim now (neither claimed, backing off, held nor parked), counted up to a limit: what should be moving")
	inFlight := intGauge("outbox.in_flight", "{message}",
		"Messages claimed by a relay under an unexpired lease, counted up to a limit")
	retrying := intGauge("outbox.retrying", "{message}",
		"Messages waiting out the backoff after a failed attempt, counted up to a limit")
	held := intGauge("outbox.held", "{message}",
		"Messages held, in ordered mode, behind a failed message of their key, counted up to a limit")
	scheduled := intGauge("outbox.scheduled", "{message}",
		"Delayed messages (Event.NotBefore) waiting until they are due, counted up to a limit")
	parked := intGauge("outbox.parked", "{message}",
		"Parked messages, which need an operator, counted up to a limit (100,000 by default) from the parked index")
	oldest := ageGauge("outbox.oldest_pending.age",
		"Age of the oldest message waiting to be published, parked ones included, 0 when none is, by the database clock")
	oldestReady := ageGauge("outbox.oldest_ready.age",
		"Age of the oldest message a relay may claim now, 0 when none is, by the database clock: how long what should be moving has waited")
	blocked := intGauge("outbox.keys.blocked", "{key}",
		"Keys with a parked message: in ordered mode their later messages wait for an operator (outbox retry or outbox discard)")
	readyGauge := intGauge("outbox.relay.ready", "{relay}",
		"1 while this relay is ready (its last round went through and its last claim is recent), 0 otherwise: summed, the relays ready")
	unrouted, err := m.Int64ObservableCounter("outbox.unroutable", metric.WithUnit("{message}"),
		metric.WithDescription("Messages no queue was bound for, by outbox.unroutable.action: dropped (relay.UnroutableDrop) or diverted to the alternate exchange (relay.UnroutableAlternate); parked ones count in outbox.messages.failed"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	dropped := metric.WithAttributes(attribute.String("outbox.unroutable.action", "dropped"))
	diverted := metric.WithAttributes(attribute.String("outbox.unroutable.action", "diverted"))
	reg, err := m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		if ready != nil {
			v := int64(0)
			if ready() {
				v = 1
			}
			obs.ObserveInt64(readyGauge, v, o.attrs)
		}
		if unroutable != nil {
			u := unroutable()
			obs.ObserveInt64(unrouted, u.Dropped, o.attrs, dropped)
			obs.ObserveInt64(unrouted, u.Diverted, o.attrs, diverted)
		}
		if store == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		g, err := store.Gauges(ctx, limit)
		if err != nil {
			return err
		}
		attrs := metric.WithAttributes(attribute.String("outbox.table", store.Table()))
		obs.ObserveInt64(pending, g.Pending, attrs)
		obs.ObserveInt64(parked, g.Parked, attrs)
		obs.ObserveFloat64(oldest, g.OldestPendingAge.Seconds(), attrs)
		obs.ObserveInt64(blocked, g.BlockedKeys, attrs)
		obs.ObserveInt64(held, g.Held, attrs)
		obs.ObserveInt64(readyMsgs, g.Ready, attrs)
		obs.ObserveInt64(inFlight, g.InFlight, attrs)
		obs.ObserveInt64(retrying, g.Retrying, attrs)
		obs.ObserveInt64(scheduled, g.Scheduled, attrs)
		obs.ObserveFloat64(oldestReady, g.OldestReadyAge.Seconds(), attrs)
		return nil
	}, pending, parked, oldest, blocked, held, readyMsgs, inFlight, retrying, scheduled, oldestReady, readyGauge, unrouted)
	o.reg = reg
	return err
}

// Close unregisters the gauges' callback.
func (o *Observer) Close() error {
	if o == nil || o.reg == nil {
		return nil
	}
	return o.reg.Unregister()
}

// Claimed implements relay.Observer.
func (o *Observer) Claimed(ctx context.Context, n int, took time.Duration, err error) {
	o.claimDur.Record(ctx, took.Seconds(), o.attrs)
	if err != nil {
		o.claimErrs.Add(ctx, 1, o.attrs)
		return
	}
	o.claimed.Add(ctx, int64(n), o.attrs)
}

// Published implements relay.Observer.
func (o *Observer) Published(ctx context.Context, n int, took time.Duration) {
	o.opDur.Record(ctx, took.Seconds(), o.publish)
	if n > 0 {
		o.sent.Add(ctx, int64(n), o.publish)
	}
}

// Lag implements relay.Observer.
func (o *Observer) Lag(ctx context.Context, _ *outbox.Message, lag time.Duration) {
	o.lag.Record(ctx, max(lag, 0).Seconds(), o.attrs)
}

// Failed implements relay.Observer.
func (o *Observer) Failed(ctx context.Context, _ *outbox.Message, class string, parked bool) {
	attrs := metric.WithAttributes(attribute.String("error.type", class))
	o.sent.Add(ctx, 1, o.publish, attrs)
	o.failed.Add(ctx, 1, o.attrs, attrs)
	if parked {
		o.parked.Add(ctx, 1, o.attrs, attrs)
	}
}

// Released implements relay.Observer.
func (o *Observer) Released(ctx context.Context, n int, reason string) {
	o.released.Add(ctx, int64(n), o.attrs, metric.WithAttributes(attribute.String("outbox.release.reason", reason)))
}

// LeasesLost implements relay.Observer.
func (o *Observer) LeasesLost(ctx context.Context, n int) {
	o.lost.Add(ctx, int64(n), o.attrs)
}

// Settled implements relay.Observer.
func (o *Observer) Settled(ctx context.Context, took time.Duration, _ error) {
	o.settleDur.Record(ctx, took.Seconds(), o.attrs)
}
