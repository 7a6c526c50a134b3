package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// shutdownKey carries, in a publish's context, the relay's own context,
// whose end begins the shutdown (see withShutdown).
type shutdownKey struct{}

// withShutdown tells a publish on ctx when the relay begins to shut down
// (run ends). The publish itself goes on until ctx ends, ShutdownTimeout
// later, for the confirms of what it sent; but what it has not sent yet
// waits for no confirm, so a connection or channel it is still opening
// then is given up at once (see connectContext): a shutdown does not wait
// out a dial to a broker that does not answer.
func withShutdown(ctx, run context.Context) context.Context {
	return context.WithValue(ctx, shutdownKey{}, run)
}

// connectContext is the context a lane connects and opens its channel on:
// ctx, ended too when the relay begins to shut down (see withShutdown).
func connectContext(ctx context.Context) (context.Context, context.CancelFunc) {
	run, ok := ctx.Value(shutdownKey{}).(context.Context)
	if !ok {
		return ctx, func() {}
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(run, cancel)
	return cctx, func() { stop(); cancel() }
}

// ensureChannel connects and opens the lane's confirm-mode channel when
// they are missing, on connectContext(ctx).
func (p *amqpLane) ensureChannel(ctx context.Context) error {
	ctx, done := connectContext(ctx)
	defer done()
	if p.conn == nil || p.conn.IsClosed() {
		p.discard(true)
		if err := p.dial(ctx); err != nil {
			return err
		}
	}
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	// Opening a channel waits for the broker's answer, with no timeout of
	// its own: a broker that stopped answering would hold the lane (and the
	// relay's publisher) forever. When ctx ends, the connection goes, and the
	// wait with it.
	conn := p.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now().Add(closeGrace)) })
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		p.discard(true)
		return fmt.Errorf("opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		p.discard(true)
		return fmt.Errorf("enabling publisher confirms: %w", err)
	}
	if ctx.Err() != nil { // the connection was closed under the open channel
		p.discard(true)
		return fmt.Errorf("opening a channel: %w", ctx.Err())
	}
	p.ch = ch
	// Buffered beyond the confirm window, and drained while confirms are
	// awaited: amqp091-go drops notifications a listener does not take
	// within seconds, and a dropped return would let an unroutable message
	// pass as published.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, confirmWindow+24))
	p.chClose = ch.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// dial connects to the first node that answers, starting with p.next.
func (p *amqpLane) dial(ctx context.Context) error {
	var errs []error
	n := p.dialer.Nodes()
	for k := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		i := (p.next + k) % n
		conn, gather, err := p.dialer.DialGather(ctx, i)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.dialer.Display(i), err))
			level := slog.LevelWarn
			if ctx.Value(quietDial{}) != nil {
				level = slog.LevelDebug
			}
			p.logger.Log(ctx, level, "relay: Cannot connect to broker node", slog.String("node", p.dialer.Display(i)), slog.String("error", err.Error()))
			continue
		}
		p.next = (i + 1) % n // a reconnect tries the other nodes first
		if p.topology != nil {
			if err := p.topology.Declare(ctx, conn); err != nil {
				_ = conn.CloseDeadline(time.Now().Add(closeGrace))
				errs = append(errs, fmt.Errorf("%s: %w", p.dialer.Display(i), err))
				p.logger.ErrorContext(ctx, "relay: Declaring the topology failed", slog.String("node", p.dialer.Display(i)), slog.String("error", err.Error()))
				continue
			}
		}
		p.conn, p.gather = conn, gather
		blocked := &atomic.Bool{}
		p.blocked = blocked
		go func(c chan amqp.Blocking) { // always drained, see ensureChannel
			for b := range c {
				blocked.Store(b.Active)
			}
		}(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
		p.logger.InfoContext(ctx, "relay: Connected to broker", slog.String("node", p.dialer.Display(i)))
		return nil
	}
	p.next = (p.next + 1) % n
	return errors.Join(errs...)
}

// discard drops the channel, and the connection too when it is dead or all
// is set. The next Publish opens what is missing. It never waits for a
// broker that does not answer: a channel is closed only once the broker
// closed it (a no-op), and a connection with a deadline.
func (p *amqpLane) discard(all bool) {
	if p.ch != nil {
		go func(c chan amqp.Return) { // let the library finish whatever it still sends
			for range c {
			}
		}(p.returns)
		if p.ch.IsClosed() {
			_ = p.ch.Close()
		} else {
			all = true // an open channel we give up on goes with its connection
		}
		p.ch = nil
	}
	if p.conn != nil && (all || p.conn.IsClosed()) {
		_ = p.conn.CloseDeadline(time.Now().Add(closeGrace))
		p.conn, p.gather = nil, nil
		p.logger.Warn("relay: Broker connection dropped; reconnecting on the next batch")
	}
}

// Close closes the connection (and with it the channel), waiting at most a
// few seconds for the broker. Publish fails with a broker fault afterwards.
func (p *AMQPPublisher) Close() error {
	if p == nil {
		return nil
	}
	if p.closed.Swap(true) {
		return nil
	}
	p.lanesMu.Lock()
	lanes := p.lanes
	p.lanesMu.Unlock()
	var errs []error
	for _, l := range lanes {
		l.mu.Lock() // after the Publish in progress, if any
		l.ch = nil
		if l.conn != nil {
			if err := l.conn.CloseDeadline(time.Now().Add(closeGrace)); err != nil && !errors.Is(err, amqp.ErrClosed) {
				errs = append(errs, err)
			}
			l.conn, l.gather = nil, nil
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
