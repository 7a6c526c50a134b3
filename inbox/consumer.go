package inbox

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/internal/periodic"
	"github.com/acemq/outbox/internal/throttle"
	"github.com/acemq/outbox/topology"
)

// Defaults and bounds of ConsumerConfig.
const (
	PrefetchDefault       = 50
	PrefetchMax           = 65535 // AMQP's prefetch count is 16 bits
	ConsumerBackoffMax    = 30 * time.Second
	RetryDelayDefault     = 500 * time.Millisecond
	consumerBackoffMin    = 100 * time.Millisecond
	consumerConnectionKey = "acemq-inbox-consumer"

	// logEvery is how often a failure that repeats is logged, with the
	// count of its repetitions since the last line.
	logEvery = 10 * time.Second
)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Queue is the queue to consume. Required. Declare it with a
	// dead-letter exchange (see Topology in package relay, or `outbox
	// declare`): without one, the broker drops what the inbox
	// dead-letters. The consumer warns at start when the queue has none.
	Queue string

	// Handler applies each new message's effect. Required.
	Handler Handler

	// Topology, when set, is declared on every connection before the
	// consumer consumes: its queue with a dead-letter queue, the bindings
	// (see package topology). A refused declaration is logged, and the
	// consumer reconnects with backoff.
	Topology *topology.Topology

	// URLs are the broker's nodes, tried in turn on every (re)connection.
	// Defaults to amqp://guest:guest@localhost:5672/.
	URLs []string

	// TLSConfig is used for amqps:// URLs. Defaults to Go's defaults.
	TLSConfig *tls.Config

	// DialTimeout bounds one attempt to connect to one node (TCP, TLS and
	// the AMQP handshake). Defaults to 10s.
	DialTimeout time.Duration

	// Heartbeat is the AMQP heartbeat interval. Defaults to amqp091-go's
	// (10s).
	Heartbeat time.Duration

	// Prefetch is how many unacked deliveries the broker sends ahead, at
	// most 65535. Defaults to 50. Use 1 to keep per-key order through
	// failed handlers (see the package documentation).
	Prefetch int

	// ConnectionName names the connection in the broker's management UI.
	// Defaults to "acemq-inbox-consumer".
	ConnectionName string

	// RetryDelay is how long a delivery whose handler failed is held
	// before it is requeued; it doubles with every counted attempt of the
	// message, jittered, up to BackoffMax. Other deliveries go on
	// meanwhile (up to Prefetch). Defaults to 500ms.
	RetryDelay time.Duration

	// BackoffMax is the longest wait between reconnection attempts, and
	// while the database fails, which grow from 100ms, jittered; it also
	// bounds RetryDelay's growth. Defaults to 30s.
	BackoffMax time.Duration

	// Logger receives connection events and failures. Defaults to the
	// Inbox's logger.
	Logger *slog.Logger

	// Observer, when set, sees every delivery's outcome, for metrics.
	Observer Observer

	// PurgeAfter, when set, makes Run purge the consumer's records older
	// than this (see Inbox.Purge) every PurgeInterval. Defaults to 0: no
	// purging.
	PurgeAfter time.Duration

	// PurgeInterval is how often Run purges when PurgeAfter is set.
	// Defaults to 1h.
	PurgeInterval time.Duration
}

// Observer sees what a Consumer does with each delivery, for metrics. It
// is called from the consumer's goroutine and must be quick.
type Observer interface {
	// Handled reports a delivery's outcome, how long its handling took
	// (the handler and the commit; not a backoff), and its error, if any.
	Handled(ctx context.Context, d *amqp.Delivery, outcome Outcome, took time.Duration, err error)
}

// Consumer consumes a queue through an Inbox: every delivery goes through
// the inbox, one at a time. It reconnects, to the configured nodes in turn
// and with backoff, whenever the connection or channel is lost; deliveries
// that were not acked then are redelivered by the broker and found by the
// inbox if their effect was committed.
//
// Failures are told apart where they are understood. A handler's error (or
// panic) is the message's: the attempt is counted and the delivery is held
// for RetryDelay, doubling with each attempt, before it is requeued, while
// other deliveries go on. A failure of the database (or a Transient error)
// is not the message's: nothing is counted, and the consumer waits,
// growing from 100ms to BackoffMax, before it requeues the delivery and
// takes the next. A failure that repeats is logged once per 10s with a
// count.
type Consumer struct {
	ib     *Inbox
	cfg    ConsumerConfig
	log    *slog.Logger
	dialer *amqpdial.Dialer
	stats  struct {
		handled, duplicates, retried, dead, refused, requeued, reconnects, purged atomic.Int64
	}
	logs       throttle.Throttle
	backoff    outbox.BackoffFunc // reconnections, and failures of the database: from 100ms
	retryDelay outbox.BackoffFunc // a failed message's redeliveries: from RetryDelay
	dlxCheck   sync.Once
}

// ConsumerStats are a consumer's running totals: one count per Outcome,
// and the reconnections and purged records.
type ConsumerStats struct {
	Handled, Duplicates, Retried, DeadLettered, Refused, Requeued, Reconnects, Purged int64
}

// Consumer returns a consumer of cfg.Queue through the inbox.
func (ib *Inbox) Consumer(cfg *ConsumerConfig) (*Consumer, error) {
	if cfg == nil || cfg.Queue == "" {
		return nil, errors.New("inbox: ConsumerConfig.Queue is required")
	}
	if cfg.Handler == nil {
		return nil, errors.New("inbox: ConsumerConfig.Handler is required")
	}
	c := *cfg
	if len(c.URLs) == 0 {
		c.URLs = []string{"amqp://guest:guest@localhost:5672/"}
	}
	if c.Prefetch < 0 || c.BackoffMax < 0 || c.PurgeAfter < 0 || c.PurgeInterval < 0 || c.RetryDelay < 0 || c.DialTimeout < 0 || c.Heartbeat < 0 {
		return nil, errors.New("inbox: ConsumerConfig.Prefetch, BackoffMax, RetryDelay, DialTimeout, Heartbeat, PurgeAfter and PurgeInterval must not be negative")
	}
	if c.Prefetch > PrefetchMax {
		return nil, fmt.Errorf("inbox: ConsumerConfig.Prefetch must be at most %d, AMQP's limit (got %d)", PrefetchMax, c.Prefetch)
	}
	if c.Topology != nil {
		if err := c.Topology.Validate(); err != nil {
			return nil, fmt.Errorf("inbox: ConsumerConfig.Topology: %w", err)
		}
	}
	c.PurgeInterval = cmp.Or(c.PurgeInterval, time.Hour)
	c.Prefetch = cmp.Or(c.Prefetch, PrefetchDefault)
	c.BackoffMax = max(cmp.Or(c.BackoffMax, ConsumerBackoffMax), consumerBackoffMin)
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
	c.ConnectionName = cmp.Or(c.ConnectionName, consumerConnectionKey)
	dialer, err := amqpdial.New("inbox", "ConsumerConfig.URLs", amqpdial.Config{URLs: c.URLs, TLS: c.TLSConfig,
		Timeout: c.DialTimeout, Heartbeat: c.Heartbeat, Name: c.ConnectionName})
	if err != nil {
		return nil, err
	}
	return &Consumer{ib: ib, cfg: c, log: cmp.Or(c.Logger, ib.logger), dialer: dialer, logs: throttle.Throttle{Every: logEvery},
		backoff: outbox.ExponentialBackoff(consumerBackoffMin, c.BackoffMax), retryDelay: outbox.ExponentialBackoff(c.RetryDelay, c.BackoffMax)}, nil
}

// Stats returns the consumer's running totals.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Handled: c.stats.handled.Load(), Duplicates: c.stats.duplicates.Load(), Retried: c.stats.retried.Load(),
		DeadLettered: c.stats.dead.Load(), Refused: c.stats.refused.Load(), Requeued: c.stats.requeued.Load(),
		Reconnects: c.stats.reconnects.Load(), Purged: c.stats.purged.Load(),
	}
}

// Run consumes until ctx ends. On shutdown it finishes the delivery in
// progress (its handler, commit and ack) and closes the connection, so that
// the broker redelivers what was sent ahead or held for a retry. It
// returns nil then; it never gives up on a broker that is down.
func (c *Consumer) Run(ctx context.Context) error {
	if c.cfg.PurgeAfter > 0 {
		purgeCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); c.purgeLoop(purgeCtx) }()
		defer func() { stop(); <-done }()
	}
	failures, node := 0, 0
	for ctx.Err() == nil {
		err := c.session(ctx, node%c.dialer.Nodes())
		node++
		if ctx.Err() != nil {
			break
		}
		failures++
		c.stats.reconnects.Add(1)
		wait := c.backoff(failures)
		msg := "connection closed"
		if err != nil {
			msg = c.dialer.Redact(err.Error())
		}
		c.log.WarnContext(ctx, "inbox: Consumer lost the broker; reconnecting", slog.String("queue", c.cfg.Queue),
			slog.String("error", msg), slog.Duration("retry_in", wait))
		periodic.Sleep(ctx, wait)
		if err == nil { // a session that ran for a while resets the backoff
			failures = 0
		}
	}
	c.log.InfoContext(context.WithoutCancel(ctx), "inbox: Consumer stopped", slog.String("queue", c.cfg.Queue))
	return nil
}

// session consumes on one connection until it is lost (returning nil
// after it delivered something, an error otherwise) or ctx ends.
func (c *Consumer) session(ctx context.Context, node int) error {
	conn, err := c.dialer.Dial(ctx, node)
	if err != nil {
		return fmt.Errorf("%s: %w", c.dialer.Display(node), err)
	}
	defer conn.Close()
	if c.cfg.Topology != nil {
		if err := c.cfg.Topology.Declare(ctx, conn); err != nil {
			return err
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	c.log.InfoContext(ctx, "inbox: Consuming", slog.String("queue", c.cfg.Queue), slog.String("node", c.dialer.Display(node)))
	c.dlxCheck.Do(func() { c.checkDeadLettering(ctx, conn) })

	// Deliveries held for a retry are requeued by goroutines of their own;
	// when the session ends they stop, and closing the connection requeues
	// what they held.
	held, release := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() { release(); wg.Wait() }()

	got, dbFailures := false, 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if got {
					return nil
				}
				return errors.New("the channel closed before any delivery")
			}
			got = true
			dbFailures = c.deliver(ctx, held, &wg, d, dbFailures)
		}
	}
}

// deliver handles one delivery through the inbox and settles it, holding
// a failed one for its retry delay (a goroutine of wg, stopped with held)
// and backing off after a failure of the database. dbFailures counts those
// in a row; deliver returns the new count.
func (c *Consumer) deliver(ctx, held context.Context, wg *sync.WaitGroup, d amqp.Delivery, dbFailures int) int {
	// The delivery in progress finishes even on shutdown.
	start := time.Now()
	r := c.ib.handle(context.WithoutCancel(ctx), &d, c.cfg.Handler, c.log)
	c.count(r.outcome)
	if c.cfg.Observer != nil {
		c.cfg.Observer.Handled(ctx, &d, r.outcome, time.Since(start), r.err)
	}
	switch r.outcome {
	case Requeued: // not the message's fault: back off, then requeue
		dbFailures++
		wait := c.backoff(dbFailures)
		c.logRepeated(ctx, slog.LevelWarn, "requeued", "inbox: Delivery requeued without counting an attempt; backing off",
			slog.String("message_id", storable(d.MessageId)), slog.String("error", r.err.Error()),
			slog.String("advice", advice(r.err)), slog.Duration("retry_in", wait))
		periodic.Sleep(ctx, wait)
		c.settle(ctx, &d, r.outcome)
		return dbFailures
	case Retried: // the message's fault: hold it, let others pass
		wait := c.retryDelay(r.attempts)
		c.logRepeated(ctx, slog.LevelWarn, "retried", "inbox: Handler failed; the delivery will be retried",
			slog.String("message_id", d.MessageId), slog.Int("attempts", r.attempts), slog.String("error", r.err.Error()),
			slog.Duration("retry_in", wait))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if periodic.Sleep(held, wait) {
				c.settle(ctx, &d, Retried)
			}
		}()
		return 0
	case Handled:
		if r.err != nil { // ErrHandlerCommitted: applied, but misused
			c.log.ErrorContext(ctx, "inbox: Handler misuse", slog.String("message_id", d.MessageId), slog.String("error", r.err.Error()))
		}
	}
	c.settle(ctx, &d, r.outcome)
	return 0
}

// settle acks, requeues or rejects d, logging a failure (the channel is
// gone: the broker redelivers).
func (c *Consumer) settle(ctx context.Context, d *amqp.Delivery, o Outcome) {
	if err := settle(d, o); err != nil {
		c.logRepeated(ctx, slog.LevelWarn, "settle", "inbox: Settling a delivery failed; the broker will redeliver it",
			slog.String("message_id", storable(d.MessageId)), slog.String("outcome", o.String()), slog.String("error", err.Error()))
	}
}

// purgeLoop purges at once and then every PurgeInterval until ctx ends.
func (c *Consumer) purgeLoop(ctx context.Context) {
	periodic.Run(ctx, c.cfg.PurgeInterval, func(ctx context.Context) {
		n, err := c.ib.Purge(ctx, c.cfg.PurgeAfter)
		switch {
		case err != nil && ctx.Err() == nil:
			c.log.ErrorContext(ctx, "inbox: Purging failed", slog.String("error", err.Error()))
		case n > 0:
			c.log.InfoContext(ctx, "inbox: Purged handled messages' records", slog.Int64("num_purged", n))
		}
		c.stats.purged.Add(n)
	})
}

func (c *Consumer) count(o Outcome) {
	switch o {
	case Handled:
		c.stats.handled.Add(1)
	case Duplicate:
		c.stats.duplicates.Add(1)
	case Retried:
		c.stats.retried.Add(1)
	case DeadLettered:
		c.stats.dead.Add(1)
	case Refused:
		c.stats.refused.Add(1)
	case Requeued:
		c.stats.requeued.Add(1)
	}
}

// logRepeated logs a failure of the given kind at most once per logEvery,
// with how often it happened since the last line.
func (c *Consumer) logRepeated(ctx context.Context, level slog.Level, kind, msg string, attrs ...slog.Attr) {
	ok, repeated := c.logs.Allow(kind, time.Now())
	if !ok {
		return
	}
	if repeated > 0 {
		attrs = append(attrs, slog.Int("repeated_since_last_line", repeated))
	}
	c.log.LogAttrs(ctx, level, msg, attrs...)
}
