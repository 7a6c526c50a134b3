package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/relay"
)

// throughput runs the throughput bench: in each run the broker alone
// (bare messages, the relay's messages, the relay's messages published as
// the relay publishes them), the relay on the messages written first, and
// the broker alone again.
func (b *bencher) throughput(ctx context.Context, out io.Writer) error {
	var broker, brokerAfter, shaped, many, relayed, ordered figure
	var cpuBroker, cpuShaped, cpuMany, cpuRelay costs
	var perRun []string // each run's relay against the broker alone just before and just after it
	var outOfOrder, outOfOrderOrdered int
	keys := "a key of its own for each"
	if b.o.keys > 0 {
		keys = fmt.Sprintf("%d key(s), in turn", b.o.keys)
	}
	for run := 1; run <= b.o.runs; run++ {
		limit, err := b.brokerOnly(ctx, false, 0)
		if err != nil {
			return err
		}
		brokerCPU := b.cpu
		limitShaped, err := b.brokerOnly(ctx, true, 0)
		if err != nil {
			return err
		}
		shapedCPU := b.cpu
		// The relay's messages as the relay publishes them: on as many
		// connections (one per batch in flight), a batch per write.
		limitMany, err := b.brokerOnly(ctx, true, b.o.inFlight)
		if err != nil {
			return err
		}
		manyCPU := b.cpu
		rate, late, err := b.relayRun(ctx, b.store)
		if err != nil {
			return err
		}
		relayCPU := b.cpu // the broker alone's phase below measures its own
		// The broker alone again: the machine's speed drifts, and a
		// relay's figure between two of the broker's shows whether it
		// drifted during the run.
		limitAfter, err := b.brokerOnly(ctx, false, 0)
		if err != nil {
			return err
		}
		broker, brokerAfter, shaped, relayed, outOfOrder = append(broker, limit), append(brokerAfter, limitAfter), append(shaped, limitShaped), append(relayed, rate), outOfOrder+late
		many, cpuMany = append(many, limitMany), append(cpuMany, manyCPU)
		cpuBroker, cpuShaped, cpuRelay = append(cpuBroker, brokerCPU), append(cpuShaped, shapedCPU), append(cpuRelay, relayCPU)
		before, after := rate/limit, rate/limitAfter
		perRun = append(perRun, fmt.Sprintf("%.2f/%.2f", before, after))
		fmt.Fprintf(b.stderr, "bench: run %d: broker alone %.0f msgs/s (the relay's messages: %.0f; as the relay publishes them: %.0f), relay %.0f msgs/s, broker alone again %.0f msgs/s: the relay = %.2f × the broker alone before it, %.2f × after, %.2f × as the relay publishes%s; %s%s; relay: %s\n",
			run, limit, limitShaped, limitMany, rate, limitAfter, before, after, rate/limitMany, b.walText(), b.deadText(), b.bookkeeping(ctx), b.phases)
		fmt.Fprintf(b.stderr, "bench: run %d: CPU: broker alone: %s; the relay's messages: %s; as the relay publishes them: %s; relay: %s; broker alone again: %s\n",
			run, brokerCPU.text(false), shapedCPU.text(false), manyCPU.text(false), relayCPU.text(b.o.relayProcess), b.cpu.text(false))
		if b.o.ordered {
			rate, late, err := b.relayRun(ctx, b.orderedStore)
			if err != nil {
				return err
			}
			ordered, outOfOrderOrdered = append(ordered, rate), outOfOrderOrdered+late
			fmt.Fprintf(b.stderr, "bench: run %d: relay in ordered mode %.0f msgs/s; relay: %s\n", run, rate, b.phases)
		}
	}
	fmt.Fprintf(out, "bench: broker alone (amqp091-go, confirms pipelined, window 1000): %s msgs/s; again after the relay: %s msgs/s\n", broker, brokerAfter)
	fmt.Fprintf(out, "bench: relay, %d messages written first over %s; %s msgs/s = %.2f × the broker alone; %d first deliveries out of their key's order\n",
		b.o.messages, keys, relayed, relayed.median()/broker.median(), outOfOrder)
	fmt.Fprintf(out, "bench: each run's relay against the broker alone just before and just after it: %s\n", strings.Join(perRun, ", "))
	fmt.Fprintf(out, "bench: broker alone publishing what the relay publishes (a key header, type, timestamp): %s msgs/s; the relay = %.2f × that\n",
		shaped, relayed.median()/shaped.median())
	fmt.Fprintf(out, "bench: the same as the relay publishes them, on %d connections at once (one per batch in flight), %d messages per write: %s msgs/s; the relay = %.2f × that\n",
		b.o.inFlight, b.o.batch, many, relayed.median()/many.median())
	if c := cpuRelay.median(); c.ok {
		fmt.Fprintf(out, "bench: CPU (medians): broker alone: %s; broker alone with the relay's messages: %s; as the relay publishes them: %s; relay: %s\n",
			cpuBroker.median().text(false), cpuShaped.median().text(false), cpuMany.median().text(false), c.text(b.o.relayProcess))
	}
	if b.o.ordered {
		fmt.Fprintf(out, "bench: relay in ordered mode, same messages: %s msgs/s = %.2f × unordered, %.2f × the broker alone; %d first deliveries out of their key's order\n",
			ordered, ordered.median()/relayed.median(), ordered.median()/broker.median(), outOfOrderOrdered)
	}
	return nil
}

// brokerOnly publishes the messages with amqp091-go alone, a window of
// 1000 unconfirmed, while the consumer drains: the limit of this broker
// and machine for this message size, without a database. Bare messages
// carry an id and a content type; shaped ones are what the relay publishes
// for the bench's events (relay.Publishing: the key in a header, the type
// and a timestamp), which cost the broker more.
//
// With conns > 0 the messages are published as the relay publishes them:
// on conns connections of their own at once (message i on connection i
// mod conns), one per batch in flight, each batch of --batch-size written
// to the socket together (a Gather, as the relay's publisher does) rather
// than one write per message, and published once the last one's confirms
// are in. Where the broker does better so than with a window of 1000, the
// relay beats the broker alone on one connection, and this is the
// stricter yardstick. The connections are dialled before the clock starts.
func (b *bencher) brokerOnly(ctx context.Context, shape bool, conns int) (float64, error) {
	pubs := []*amqp.Connection{b.pubConn}
	gathers := []*amqpdial.Gather{nil}
	if conns > 0 {
		d := b.dialer.Named("outbox-bench-publisher")
		pubs, gathers = pubs[:0], gathers[:0]
		for range conns {
			c, g, err := d.DialGather(ctx, 0)
			if err != nil {
				return 0, fmt.Errorf("cannot reach RabbitMQ at %s: %w", d.Display(0), err)
			}
			defer c.Close()
			pubs, gathers = append(pubs, c), append(gathers, g)
		}
	}
	chans := make([]*amqp.Channel, len(pubs))
	for i, c := range pubs {
		ch, err := c.Channel()
		if err != nil {
			return 0, err
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			return 0, err
		}
		chans[i] = ch
	}
	wait, err := b.consume(ctx, b.o.messages, func(*amqp.Delivery) {})
	if err != nil {
		return 0, err
	}
	cpu := readCPU(0)
	start := time.Now()
	errs := make([]error, len(chans))
	var wg sync.WaitGroup
	for k, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = b.publishAlone(ctx, ch, gathers[k], shape, k, len(chans))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	if err := wait(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	b.cpu = readCPU(0).sub(cpu).per(b.o.messages)
	return float64(b.o.messages) / elapsed.Seconds(), nil
}

// publishAlone publishes on ch the bench's messages i with i mod of == k,
// keeping a window of 1000 unconfirmed, and waits for their confirms. With
// g, each --batch-size of them is written to the socket together, and the
// next batch waits for the confirms of the last, as a relay's publisher
// publishes a batch at a time.
func (b *bencher) publishAlone(ctx context.Context, ch *amqp.Channel, g *amqpdial.Gather, shape bool, k, of int) error {
	confirms := make([]*amqp.DeferredConfirmation, 0, b.o.messages/of+1)
	oldest, held := 0, 0
	per, window := 1, 1000 // messages per write, unconfirmed at most
	if g != nil {
		per, window = b.o.batch, b.o.batch // as the relay: a batch in flight on each connection
	}
	for i := k; i < b.o.messages; i += of {
		if held == 0 {
			g.Hold()
		}
		msg := amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: "broker-" + strconv.Itoa(i), Body: b.payload,
		}
		if shape {
			msg = relay.Publishing(&outbox.Message{ID: msg.MessageId, Key: b.key(i), EventType: "bench.tick", ContentType: msg.ContentType,
				CreatedAt: time.Now(), Payload: b.payload})
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, "bench.tick", true, false, msg)
		if err != nil {
			return err
		}
		confirms = append(confirms, dc)
		if held++; held < per && i+of < b.o.messages {
			continue
		}
		if err := g.Flush(); err != nil {
			return err
		}
		held = 0
		for len(confirms)-oldest >= window {
			if _, err := confirms[oldest].WaitContext(ctx); err != nil {
				return err
			}
			oldest++
		}
	}
	for _, dc := range confirms[oldest:] {
		if _, err := dc.WaitContext(ctx); err != nil {
			return err
		}
	}
	return nil
}
