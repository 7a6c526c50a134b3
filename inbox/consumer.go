package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Defaults of ConsumerConfig.
const (
	PrefetchDefault       = 50
	ConsumerBackoffMax    = 30 * time.Second
	consumerBackoffMin    = 100 * time.Millisecond
	consumerConnectionKey = "acemq-inbox-consumer"
)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Queue is the queue to consume. Required.
	Queue string

	// Handler applies each new message's effect. Required.
	Handler Handler

	// URLs are the broker's nodes, tried in turn on every (re)connection.
	// Defaults to amqp://guest:guest@localhost:5672/.
	URLs []string

	// Prefetch is how many unacked deliveries the broker sends ahead.
	// Defaults to 50. Use 1 to keep per-key order through failed handlers
	// (see the package documentation).
	Prefetch int

	// ConnectionName names the connection in the broker's management UI.
	// Defaults to "acemq-inbox-consumer".
	ConnectionName string

	// BackoffMax is the longest wait between reconnection attempts, which
	// grow from 100ms, jittered. Defaults to 30s.
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
	// Handled reports a delivery's outcome, how long Handle took (the
	// handler, the commit and the ack), and its error, if any.
	Handled(ctx context.Context, d *amqp.Delivery, outcome Outcome, took time.Duration, err error)
}

// Consumer consumes a queue through an Inbox: every delivery goes through
// Handle, one at a time. It reconnects, to the configured nodes in turn and
// with backoff, whenever the connection or channel is lost; deliveries that
// were not acked then are redelivered by the broker and found by the inbox
// if their effect was committed.
type Consumer struct {
	ib    *Inbox
	cfg   ConsumerConfig
	log   *slog.Logger
	stats struct{ handled, duplicates, retried, dead, refused, reconnects, purged atomic.Int64 }

	passwords []string // of the configured URLs, kept out of the logs
}

// ConsumerStats are a consumer's running totals.
type ConsumerStats struct {
	Handled, Duplicates, Retried, DeadLettered, Refused, Reconnects, Purged int64
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
	var passwords []string
	for i, u := range c.URLs {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			return nil, fmt.Errorf("inbox: AMQP URL #%d is not a valid amqp:// or amqps:// URL", i+1) // never the URL: it may hold a password
		}
		if uri.Password != "" {
			passwords = append(passwords, uri.Password)
		}
	}
	if c.Prefetch < 0 || c.BackoffMax < 0 || c.PurgeAfter < 0 || c.PurgeInterval < 0 {
		return nil, errors.New("inbox: ConsumerConfig.Prefetch, BackoffMax, PurgeAfter and PurgeInterval must not be negative")
	}
	c.PurgeInterval = cmp.Or(c.PurgeInterval, time.Hour)
	c.Prefetch = cmp.Or(c.Prefetch, PrefetchDefault)
	c.BackoffMax = max(cmp.Or(c.BackoffMax, ConsumerBackoffMax), consumerBackoffMin)
	c.ConnectionName = cmp.Or(c.ConnectionName, consumerConnectionKey)
	return &Consumer{ib: ib, cfg: c, log: cmp.Or(c.Logger, ib.logger), passwords: passwords}, nil
}

// Stats returns the consumer's running totals.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Handled: c.stats.handled.Load(), Duplicates: c.stats.duplicates.Load(), Retried: c.stats.retried.Load(),
		DeadLettered: c.stats.dead.Load(), Refused: c.stats.refused.Load(), Reconnects: c.stats.reconnects.Load(),
		Purged: c.stats.purged.Load(),
	}
}

// Run consumes until ctx ends. On shutdown it finishes the delivery in
// progress (its handler, commit and ack) and closes the connection, so that
// the broker redelivers what was sent ahead. It returns nil then; it never
// gives up on a broker that is down.
func (c *Consumer) Run(ctx context.Context) error {
	if c.cfg.PurgeAfter > 0 {
		purgeCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); c.purgeLoop(purgeCtx) }()
		defer func() { stop(); <-done }()
	}
	failures, node := 0, 0
	for ctx.Err() == nil {
		err := c.session(ctx, c.cfg.URLs[node%len(c.cfg.URLs)])
		node++
		if ctx.Err() != nil {
			break
		}
		failures++
		c.stats.reconnects.Add(1)
		wait := min(c.cfg.BackoffMax, consumerBackoffMin<<min(failures-1, 20))
		wait = wait/2 + rand.N(wait/2+1)
		c.log.WarnContext(ctx, "inbox: Consumer lost the broker; reconnecting", slog.String("queue", c.cfg.Queue),
			slog.String("error", c.redacted(err)), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if err == nil { // a session that ran for a while resets the backoff
			failures = 0
		}
	}
	c.log.InfoContext(context.WithoutCancel(ctx), "inbox: Consumer stopped", slog.String("queue", c.cfg.Queue))
	return nil
}

// session consumes on one connection until it is lost (returning nil
// after it delivered something, an error otherwise) or ctx ends.
func (c *Consumer) session(ctx context.Context, url string) error {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.cfg.ConnectionName)
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: props})
	if err != nil {
		return err
	}
	defer conn.Close()
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
	c.log.InfoContext(ctx, "inbox: Consuming", slog.String("queue", c.cfg.Queue))
	got := false
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
			// The delivery in progress finishes even on shutdown.
			start := time.Now()
			outcome, err := c.ib.Handle(context.WithoutCancel(ctx), &d, c.cfg.Handler)
			c.count(outcome)
			if c.cfg.Observer != nil {
				c.cfg.Observer.Handled(ctx, &d, outcome, time.Since(start), err)
			}
			if err != nil && outcome != Retried {
				c.log.WarnContext(ctx, "inbox: Delivery not handled", slog.String("message_id", d.MessageId),
					slog.String("outcome", outcome.String()), slog.String("error", err.Error()))
			}
		}
	}
}

// purgeLoop purges at once and then every PurgeInterval until ctx ends.
func (c *Consumer) purgeLoop(ctx context.Context) {
	tick := time.NewTicker(c.cfg.PurgeInterval)
	defer tick.Stop()
	for {
		n, err := c.ib.Purge(ctx, c.cfg.PurgeAfter)
		switch {
		case err != nil && ctx.Err() == nil:
			c.log.ErrorContext(ctx, "inbox: Purging failed", slog.String("error", err.Error()))
		case n > 0:
			c.log.InfoContext(ctx, "inbox: Purged handled messages' records", slog.Int64("num_purged", n))
		}
		c.stats.purged.Add(n)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
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
	}
}

// redacted returns err's text with the passwords of the configured URLs
// replaced, so that none reaches the logs.
func (c *Consumer) redacted(err error) string {
	if err == nil {
		return "connection closed"
	}
	msg := err.Error()
	for _, p := range c.passwords {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}
