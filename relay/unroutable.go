package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/acemq/outbox"
)

// Unroutable says what an AMQPPublisher does with a message that no queue
// is bound for: the broker accepted it and routed it nowhere. Which one is
// right depends on what the exchange is for.
type Unroutable int

const (
	// UnroutablePark treats it as the message's failure: an attempt is
	// counted and, after MaxAttempts, it is parked (in ordered mode its
	// key waits behind it) until an operator binds a queue and runs
	// `outbox retry`. Nothing is ever lost silently; the default, and
	// right when every event has a consumer that must see it.
	UnroutablePark Unroutable = iota

	// UnroutableAlternate publishes it again to AMQPConfig.AlternateExchange
	// with its routing key: an exchange that keeps what nobody subscribed
	// to yet (a queue to replay from later). It is parked only if that is
	// unroutable too. Right for an event bus whose consumers come later.
	// (RabbitMQ can do the same without the relay: declare the exchange
	// with an alternate-exchange, see Topology.)
	UnroutableAlternate

	// UnroutableDrop counts it as published: it is gone, logged (once per
	// exchange and routing key per minute, with a count) and counted
	// (AMQPPublisher.Unroutable, the metric outbox.unroutable). Right when
	// an event nobody listens to is worth nothing.
	UnroutableDrop
)

func (u Unroutable) String() string {
	switch u {
	case UnroutablePark:
		return "park"
	case UnroutableAlternate:
		return "alternate"
	case UnroutableDrop:
		return "drop"
	}
	return fmt.Sprintf("Unroutable(%d)", int(u))
}

// ParseUnroutable reads "park", "alternate" or "drop".
func ParseUnroutable(s string) (Unroutable, error) {
	for _, u := range []Unroutable{UnroutablePark, UnroutableAlternate, UnroutableDrop} {
		if s == u.String() {
			return u, nil
		}
	}
	return 0, fmt.Errorf("relay: unknown Unroutable %q: park, alternate or drop", s)
}

// UnroutableStats counts what an AMQPPublisher did with unroutable
// messages under UnroutableAlternate and UnroutableDrop (under
// UnroutablePark they are failures, counted by the relay).
type UnroutableStats struct {
	Diverted int64 // published to the alternate exchange
	Dropped  int64 // counted as published, routed nowhere
}

// Unroutable returns the publisher's running totals.
func (p *AMQPPublisher) Unroutable() UnroutableStats {
	return UnroutableStats{Diverted: p.diverted.Load(), Dropped: p.dropped.Load()}
}

// unroutableLogEvery is how often a dropped or diverted routing key is
// logged.
const unroutableLogEvery = time.Minute

// settleUnroutable applies the configured Unroutable to the messages errs
// reports unroutable.
func (p *amqpLane) settleUnroutable(ctx context.Context, msgs []outbox.Message, errs []error) {
	if p.unroutable == UnroutablePark {
		return
	}
	var again []int
	for i, err := range errs {
		var pe *PublishError
		if !errors.As(err, &pe) || pe.Class != ClassUnroutable || pe.BrokerFault {
			continue
		}
		if p.unroutable == UnroutableDrop {
			errs[i] = nil
			p.dropped.Add(1)
			p.logUnroutable(ctx, &msgs[i], "relay: Unroutable message dropped (AMQPConfig.Unroutable = drop): bind a queue to receive such events")
			continue
		}
		again = append(again, i)
	}
	if len(again) == 0 {
		return
	}
	diverted := make([]outbox.Message, len(again))
	for k, i := range again {
		diverted[k] = msgs[i]
		diverted[k].Exchange = p.alternate
	}
	sub := p.publishIsolating(ctx, diverted, 0, nil)
	for k, i := range again {
		var pe *PublishError
		switch err := sub[k]; {
		case err == nil:
			errs[i] = nil
			p.diverted.Add(1)
			p.logUnroutable(ctx, &msgs[i], "relay: Unroutable message published to the alternate exchange")
		case errors.As(err, &pe) && pe.Class == ClassUnroutable && !pe.BrokerFault:
			errs[i] = messageFault(msgs[i].ID, ClassUnroutable, fmt.Sprintf("unroutable on exchange %q and on the alternate exchange %q for routing key %q; bind a queue to either",
				msgs[i].Exchange, p.alternate, msgs[i].RoutingKey))
		default:
			errs[i] = err
		}
	}
}

func (p *amqpLane) logUnroutable(ctx context.Context, m *outbox.Message, msg string) {
	ok, held := p.unroutableLog.Allow(m.Exchange+"\x00"+m.RoutingKey, time.Now())
	if !ok {
		return
	}
	p.logger.WarnContext(ctx, msg, slog.String("exchange", m.Exchange), slog.String("routing_key", m.RoutingKey),
		slog.String("event_type", m.EventType), slog.String("outbox_id", m.ID), slog.String("alternate_exchange", p.alternate),
		slog.Int("more_since_last_line", held))
}
