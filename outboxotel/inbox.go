package outboxotel

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/acemq/outbox/inbox"
)

// InboxObserver is an inbox.Observer that records OpenTelemetry metrics:
// messaging.client.consumed.messages by outbox.inbox.outcome (handled,
// duplicate, retried, dead-lettered, refused, requeued: inbox.Outcome's
// names) and messaging.process.duration.
type InboxObserver struct {
	consumed metric.Int64Counter
	process  metric.Float64Histogram
	attrs    []attribute.KeyValue
}

var _ inbox.Observer = (*InboxObserver)(nil)

// NewInboxObserver makes the instruments on mp (the global MeterProvider
// when nil) for the named consumer.
func NewInboxObserver(mp metric.MeterProvider, consumer string) (*InboxObserver, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	consumed, err1 := m.Int64Counter("messaging.client.consumed.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries the inbox consumer took, by outbox.inbox.outcome"))
	process, err2 := m.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to handle a delivery through the inbox: the handler, the commit and the ack"),
		metric.WithExplicitBucketBoundaries(durations...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &InboxObserver{consumed: consumed, process: process, attrs: []attribute.KeyValue{
		attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.consumer.group.name", consumer),
	}}, nil
}

// Handled implements inbox.Observer.
func (o *InboxObserver) Handled(ctx context.Context, d *amqp.Delivery, outcome inbox.Outcome, took time.Duration, err error) {
	attrs := append(o.attrs[:len(o.attrs):len(o.attrs)],
		attribute.String("outbox.inbox.outcome", outcome.String()),
		attribute.String("messaging.destination.name", d.RoutingKey))
	if err != nil {
		attrs = append(attrs, attribute.String("error.type", outcome.String()))
	}
	opt := metric.WithAttributes(attrs...)
	o.consumed.Add(ctx, 1, opt)
	o.process.Record(ctx, took.Seconds(), opt)
}
