// Package topology declares what the outbox's messages need on the broker:
// the exchanges the relay publishes to, the queues consumers read, their
// bindings, and a dead-letter queue for each queue, so that nothing an
// inbox dead-letters is dropped.
//
// Declaring is idempotent: declaring what exists with the same settings
// changes nothing, so the relay (relay.AMQPConfig.Topology), the inbox's
// consumer (inbox.ConsumerConfig.Topology) and `outbox declare` can all
// declare at start. Declaring what exists with other settings fails with
// an error that names the setting: RabbitMQ never changes an existing
// queue's arguments.
//
//	t := &topology.Topology{
//		Exchanges: []topology.Exchange{{Name: "shop"}},
//		Queues: []topology.Queue{{Name: "billing", Bindings: []topology.Binding{{Exchange: "shop", Key: "order.#"}}}},
//	}
//	err := t.Declare(ctx, conn) // exchange shop (topic), quorum queue billing bound to it, quorum queue billing.dead
//
// Who must create what: the relay publishes to exchanges; a message routed
// to no queue is "unroutable" (see relay.Unroutable). The queues belong to
// the consumers. Declare both before the first event: an event published
// before its queue is bound reaches nobody.
package topology

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology is what to declare.
type Topology struct {
	Exchanges []Exchange `json:"exchanges,omitempty"`
	Queues    []Queue    `json:"queues,omitempty"`
}

// Exchange is a durable exchange.
type Exchange struct {
	// Name of the exchange. Required; the default exchange ("") needs no
	// declaring.
	Name string `json:"name"`
	// Kind is "topic" (the default), "direct", "fanout" or "headers".
	Kind string `json:"kind,omitempty"`
	// AlternateExchange, when set, makes RabbitMQ route what no queue is
	// bound for to this exchange (declared too, as a fanout, if no
	// Exchange of the topology names it): the broker's own answer to
	// unroutable events.
	AlternateExchange string `json:"alternate_exchange,omitempty"`
}

// Queue is a durable queue with its bindings and its dead-letter queue.
type Queue struct {
	// Name of the queue. Required.
	Name string `json:"name"`
	// Classic makes a classic queue; by default it is a quorum queue
	// (replicated; what RabbitMQ recommends for messages that must not be
	// lost).
	Classic bool `json:"classic,omitempty"`
	// Bindings bind the queue to exchanges.
	Bindings []Binding `json:"bindings,omitempty"`
	// DeadLetterQueue receives what is dead-lettered from the queue,
	// through the default exchange. Defaults to Name + ".dead".
	DeadLetterQueue string `json:"dead_letter_queue,omitempty"`
	// NoDeadLetter declares no dead-letter queue: the broker then drops
	// what a consumer dead-letters.
	NoDeadLetter bool `json:"no_dead_letter,omitempty"`
}

// Binding binds a queue to an exchange with a binding key (a topic
// pattern such as "order.#" on a topic exchange).
type Binding struct {
	Exchange string `json:"exchange"`
	Key      string `json:"key"`
}

// Parse reads a topology from JSON, refusing unknown fields.
func Parse(r io.Reader) (*Topology, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var t Topology
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	return &t, t.Validate()
}

var kinds = map[string]bool{"": true, "topic": true, "direct": true, "fanout": true, "headers": true}

// Validate checks names and kinds without a broker.
func (t *Topology) Validate() error {
	if t == nil {
		return errors.New("topology: nil Topology")
	}
	var errs []error
	name := func(what, n string) {
		switch {
		case n == "":
			errs = append(errs, fmt.Errorf("topology: %s has no name", what))
		case len(n) > 255:
			errs = append(errs, fmt.Errorf("topology: %s %.40q… is longer than 255 bytes, AMQP's limit", what, n))
		case strings.HasPrefix(n, "amq."):
			errs = append(errs, fmt.Errorf("topology: %s %q: names starting with amq. are the broker's", what, n))
		}
	}
	exchanges := map[string]bool{}
	for _, e := range t.Exchanges {
		name("an exchange", e.Name)
		exchanges[e.Name] = true
		if !kinds[e.Kind] {
			errs = append(errs, fmt.Errorf("topology: exchange %q has kind %q: topic, direct, fanout or headers", e.Name, e.Kind))
		}
	}
	for _, q := range t.Queues {
		name("a queue", q.Name)
		for _, b := range q.Bindings {
			if b.Exchange == "" {
				errs = append(errs, fmt.Errorf("topology: queue %q: a binding names no exchange (the default exchange routes by queue name without one)", q.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// Step is one declaration.
type Step struct {
	What string // "exchange", "queue" or "binding"
	Desc string // what is declared, for people
	do   func(ch *amqp.Channel) error
}

// Plan returns the declarations Declare makes, in order: exchanges,
// dead-letter queues, queues, bindings.
func (t *Topology) Plan() ([]Step, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	var steps []Step
	declared := map[string]bool{}
	exchange := func(name, kind string, args amqp.Table, note string) {
		if declared[name] {
			return
		}
		declared[name] = true
		kind = cmp.Or(kind, "topic")
		steps = append(steps, Step{What: "exchange", Desc: fmt.Sprintf("exchange %s (%s, durable%s)", name, kind, note),
			do: func(ch *amqp.Channel) error { return ch.ExchangeDeclare(name, kind, true, false, false, false, args) }})
	}
	for _, e := range t.Exchanges {
		var args amqp.Table
		note := ""
		if e.AlternateExchange != "" {
			args = amqp.Table{"alternate-exchange": e.AlternateExchange}
			note = ", unroutable messages to " + e.AlternateExchange
		}
		exchange(e.Name, e.Kind, args, note)
	}
	for _, e := range t.Exchanges {
		if e.AlternateExchange != "" {
			exchange(e.AlternateExchange, "fanout", nil, ", alternate exchange")
		}
	}
	queue := func(name string, classic bool, args amqp.Table, note string) {
		typ := "quorum"
		if classic {
			typ = "classic"
		}
		a := amqp.Table{"x-queue-type": typ}
		for k, v := range args {
			a[k] = v
		}
		steps = append(steps, Step{What: "queue", Desc: fmt.Sprintf("queue %s (%s, durable%s)", name, typ, note),
			do: func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclare(name, true, false, false, false, a)
				return err
			}})
	}
	for _, q := range t.Queues {
		var args amqp.Table
		note := ", no dead-letter queue: dead-lettered messages are dropped"
		if !q.NoDeadLetter {
			dlq := cmp.Or(q.DeadLetterQueue, q.Name+".dead")
			queue(dlq, q.Classic, nil, ", dead letters of "+q.Name)
			args = amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
			note = ", dead letters to " + dlq
		}
		queue(q.Name, q.Classic, args, note)
	}
	for _, q := range t.Queues {
		for _, b := range q.Bindings {
			steps = append(steps, Step{What: "binding", Desc: fmt.Sprintf("binding %s -> %s, key %q", b.Exchange, q.Name, b.Key),
				do: func(ch *amqp.Channel) error { return ch.QueueBind(q.Name, b.Key, b.Exchange, false, nil) }})
		}
	}
	return steps, nil
}

// Declare declares the topology on conn, in the order of Plan, on a
// channel of its own. It stops at the first refusal (which closes that
// channel), with an error that says which step and why.
func (t *Topology) Declare(ctx context.Context, conn *amqp.Connection) error {
	steps, err := t.Plan()
	if err != nil {
		return err
	}
	if conn == nil {
		return errors.New("topology: Declare: nil connection")
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("topology: opening a channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.do(ch); err != nil {
			return fmt.Errorf("topology: declaring %s: %w%s", s.Desc, err, hint(err))
		}
	}
	return nil
}

// hint explains the refusals people meet.
func hint(err error) string {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return ""
	}
	switch ae.Code {
	case amqp.PreconditionFailed:
		return " (it exists with other settings, which RabbitMQ never changes: match them, or delete it and declare it again)"
	case amqp.NotFound:
		return " (declare the exchange first, or add it to the topology)"
	case amqp.AccessRefused:
		return " (the user lacks the configure permission on it)"
	}
	return ""
}
