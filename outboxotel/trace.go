package outboxotel

import (
	"context"
	"errors"
	"maps"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// Headers returns an outbox.HeaderFunc that writes the trace context of
// the writer's context into every event's headers, so that the relay's
// publish span, and through it the consumer, continue the writer's trace.
// Set it as StoreConfig.Headers, gormoutbox.Plugin.Headers or
// entoutbox's StoreConfig: that one line is all the writing side needs.
// p defaults to W3C Trace Context (traceparent, tracestate) rather than the
// global propagator, which is a no-op until an application sets one.
func Headers(p propagation.TextMapPropagator) outbox.HeaderFunc {
	if p == nil {
		p = propagation.TraceContext{}
	}
	return func(ctx context.Context) map[string]string {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return nil
		}
		carrier := propagation.MapCarrier{}
		p.Inject(ctx, carrier)
		return carrier
	}
}

// TraceConfig configures Tracing. The zero value (and nil) gives the
// defaults.
type TraceConfig struct {
	// TracerProvider makes the tracer. Defaults to the global one.
	TracerProvider trace.TracerProvider

	// Propagator reads the writer's trace context from a message's headers
	// and writes the publish span's into the message. Defaults to W3C
	// Trace Context, as Headers writes it.
	Propagator propagation.TextMapPropagator

	// System is the messaging.system attribute. Defaults to "rabbitmq".
	System string
}

// Tracing wraps a relay.Publisher so that every message is published in a
// producer span of its own, a child of the writer's span (read from the
// message's headers), and travels with the publish span's traceparent, so
// that the consumer's span continues the same trace.
//
// One span per message, not one per batch with links: a batch of 500 holds
// messages of up to 500 traces, and only a span of its own makes the
// publish a step of each message's trace (a link would leave the
// consumer's trace disconnected from the writer's). A span costs about a
// microsecond, next to milliseconds of broker confirms.
func Tracing(pub relay.Publisher, cfg *TraceConfig) relay.Publisher {
	if cfg == nil {
		cfg = &TraceConfig{}
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := cfg.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	system := cfg.System
	if system == "" {
		system = "rabbitmq"
	}
	t := &tracingPublisher{pub: pub, tracer: tp.Tracer(ScopeName), prop: prop, system: system}
	if cp, ok := pub.(relay.ConcurrentPublisher); ok && cp.Concurrent() {
		return concurrentTracingPublisher{t}
	}
	return t
}

type tracingPublisher struct {
	pub    relay.Publisher
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	system string
}

type concurrentTracingPublisher struct{ *tracingPublisher }

func (concurrentTracingPublisher) Concurrent() bool { return true }

// Publish publishes msgs, each in a producer span of its own.
func (t *tracingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	out := make([]outbox.Message, len(msgs))
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		parent := t.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers))
		dest := m.Exchange
		if dest == "" {
			dest = "amq.default"
		}
		sctx, span := t.tracer.Start(parent, "publish "+dest, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", t.system),
				attribute.String("messaging.operation.name", "publish"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", dest),
				attribute.String("messaging.rabbitmq.destination.routing_key", m.RoutingKey),
				attribute.String("messaging.message.id", m.ID),
				attribute.Int("messaging.message.body.size", len(m.Payload)),
			))
		headers := maps.Clone(m.Headers)
		if headers == nil {
			headers = map[string]string{}
		}
		t.prop.Inject(sctx, propagation.MapCarrier(headers))
		m.Headers = headers
		out[i], spans[i] = m, span
	}
	errs := t.pub.Publish(ctx, out)
	for i, span := range spans {
		if i < len(errs) && errs[i] != nil {
			span.RecordError(errs[i])
			span.SetStatus(codes.Error, errs[i].Error())
			var pe *relay.PublishError
			if errors.As(errs[i], &pe) && pe.Class != "" {
				span.SetAttributes(attribute.String("error.type", pe.Class))
			}
		}
		span.End()
	}
	return errs
}

// Close closes the wrapped publisher.
func (t *tracingPublisher) Close() error { return t.pub.Close() }
