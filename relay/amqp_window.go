package relay

// A window's publish: the messages out, their confirms and returns in, and
// the search for a message the broker refused without naming it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
)

// confirmGroups gathers the confirmed messages of a window for
// PublishConfirming's report: a report costs the relay a statement, so it
// waits for reportEvery of them, and for all that arrive together (the
// multiple acks of a busy broker), but holds none while the publisher waits
// for the next confirm.
type confirmGroups struct {
	report func([]int) // nil: nothing is reported
	ready  []int
}

// add gathers the message at index i, confirmed.
func (g *confirmGroups) add(i int) {
	if g.report != nil {
		g.ready = append(g.ready, i)
	}
}

// waiting says the publisher is about to wait for a confirm that has not
// arrived: what is gathered is reported if it is enough.
func (g *confirmGroups) waiting() {
	if g.report != nil && len(g.ready) >= reportEvery {
		g.report(g.ready)
		g.ready = nil
	}
}

// end reports the rest: the window is confirmed, or given up on.
func (g *confirmGroups) end() {
	if g.report != nil && len(g.ready) > 0 {
		g.report(g.ready)
		g.ready = nil
	}
}

// publishIsolating publishes a window and, if the broker closed the channel
// for a reason that points at no message in particular, republishes the
// suspects in halves until each is either confirmed or alone and refused.
// report, when not nil, is told of confirmed messages as they come (the
// first round only: a message isolated again is reported with the result).
func (p *amqpLane) publishIsolating(ctx context.Context, msgs []outbox.Message, depth int, report func([]int)) []error {
	errs := p.publishWindow(ctx, msgs, report)
	var suspects []int
	for i, err := range errs {
		if pe, ok := err.(*PublishError); ok && pe.suspect {
			suspects = append(suspects, i)
		}
	}
	if len(suspects) == 0 {
		return errs
	}
	if len(msgs) == 1 {
		// Alone on a fresh channel, and the broker still refused what
		// the client sent: this message is the cause.
		pe := errs[0].(*PublishError)
		errs[0] = messageFault(msgs[0].ID, ClassRefused, "the broker closed the channel when this message was published on its own: "+pe.Err.Error())
		return errs
	}
	if ctx.Err() != nil {
		return errs // out of time: the suspects stay broker faults, released
	}
	if depth == 0 {
		p.logger.WarnContext(ctx, "relay: The broker closed the channel because of a message it was sent; publishing the unconfirmed messages in smaller groups to find it",
			slog.Int("num_suspects", len(suspects)), slog.String("error", errs[suspects[0]].(*PublishError).Err.Error()))
	}
	group := make([]outbox.Message, len(suspects))
	for k, i := range suspects {
		group[k] = msgs[i]
	}
	half := len(group) / 2
	sub := p.publishIsolating(ctx, group[:half], depth+1, nil)
	sub = append(sub, p.publishIsolating(ctx, group[half:], depth+1, nil)...)
	for k, i := range suspects {
		errs[i] = sub[k]
	}
	return errs
}

// publishWindow publishes at most confirmWindow messages and awaits their
// confirms, with at most unconfirmedMax of them published and not yet
// confirmed at any moment (see unconfirmedMax). The bound matters: the
// broker's returns (unroutable messages) wait in a buffer larger than the
// window, so the library never has to drop one, which would let an
// unroutable message pass as published.
func (p *amqpLane) publishWindow(ctx context.Context, msgs []outbox.Message, report func([]int)) []error {
	w := &window{lane: p, ctx: ctx, msgs: msgs, errs: make([]error, len(msgs)), returned: make(map[string]amqp.Return),
		groups: confirmGroups{report: report}}
	if p.closed.Load() {
		return w.fail(ClassClosed, "the publisher was closed", ErrPublisherClosed)
	}
	if err := p.ensureChannel(ctx); err != nil {
		return w.fail(ClassConnection, "cannot connect to the broker", err)
	}
	if p.blocked.Load() {
		return w.fail(ClassBlocked, "the broker has blocked the connection (a memory or disk alarm)", nil)
	}
	// A publish that blocks on a socket the broker stopped reading cannot be
	// interrupted otherwise: when ctx ends, the connection goes.
	conn := p.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now().Add(closeGrace)) })
	defer stop()
	w.returns = p.returns
	w.send()
	// Await the confirms still out. Returns for a message precede its
	// confirm, and are read while waiting so that the library never has to
	// drop one.
	for w.head < len(w.pending) && w.await() {
	}
	w.groups.end()
	w.drain()
	return w.settle()
}

// window is one publishWindow in progress.
type window struct {
	lane     *amqpLane
	ctx      context.Context
	msgs     []outbox.Message
	errs     []error
	pending  []inflight // published, in order; those before head are confirmed or given up on
	head     int
	returned map[string]amqp.Return
	returns  chan amqp.Return // nil once the channel closed
	pubErr   error            // the publish or the flush that failed
	timedOut bool
	groups   confirmGroups
}

type inflight struct {
	i  int
	dc *amqp.DeferredConfirmation
}

// fail gives every message of the window the same broker fault.
func (w *window) fail(class, reason string, err error) []error {
	for i, m := range w.msgs {
		w.errs[i] = brokerFault(m.ID, class, reason, err)
	}
	return w.errs
}

func (w *window) take(r amqp.Return, ok bool) {
	if !ok { // the channel closed: stop selecting on it
		w.returns = nil
		return
	}
	w.returned[r.MessageId] = r
}

// drain takes the returns that are there, without waiting.
func (w *window) drain() {
	for w.returns != nil {
		select {
		case r, ok := <-w.returns:
			w.take(r, ok)
		default:
			return
		}
	}
}

// send publishes the window's messages, gathered into few writes (see
// amqpdial.Gather), waiting for the oldest confirm whenever unconfirmedMax
// are out.
func (w *window) send() {
	p := w.lane
	maxSize, sizeFrom := p.maxMessageSize.Load(), "AMQPConfig.MaxMessageSize"
	if maxSize < p.configuredSize {
		sizeFrom = "its max_message_size, learned from a refusal"
	}
	p.gather.Hold()
	for i := range w.msgs {
		m := &w.msgs[i]
		if int64(len(m.Payload)) > maxSize {
			w.errs[i] = messageFault(m.ID, ClassOversized, fmt.Sprintf("message body is %d bytes, larger than the %d bytes the broker accepts (%s); store large payloads elsewhere and send a reference", len(m.Payload), maxSize, sizeFrom))
			continue
		}
		if reason := unencodable(m); reason != "" {
			w.errs[i] = messageFault(m.ID, ClassUnencodable, reason)
			continue
		}
		if w.pubErr == nil && !w.timedOut && len(w.pending)-w.head >= unconfirmedMax {
			// Out with what is gathered, and wait for the oldest (await
			// sets timedOut when the publish runs out of time first).
			if err := p.gather.Flush(); err != nil {
				w.pubErr = err
			} else {
				w.await()
			}
			p.gather.Hold()
		}
		if w.pubErr != nil || w.timedOut {
			w.errs[i] = brokerFault(m.ID, ClassConnection, "channel failed during the batch", w.pubErr)
			continue
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(w.ctx, m.Exchange, m.RoutingKey,
			true,  // mandatory: an unroutable message comes back instead of vanishing
			false, // immediate: not supported by RabbitMQ
			Publishing(m))
		if err != nil {
			w.pubErr = err
			if encodingError(err) {
				// The library refused this message, not the network.
				// Blaming it keeps a message nothing can send from
				// blocking the outbox; the connection is dropped below,
				// as its state is uncertain after a partial publish.
				w.errs[i] = messageFault(m.ID, ClassUnencodable, "the AMQP client could not encode the message: "+err.Error())
			} else {
				w.errs[i] = brokerFault(m.ID, ClassConnection, "channel failed during the batch", err)
			}
			continue
		}
		w.pending = append(w.pending, inflight{i, dc})
		w.drain()
	}
	if err := p.gather.Flush(); err != nil && w.pubErr == nil {
		// The socket is closed: what was not confirmed is a broker fault.
		w.pubErr = err
	}
}

// await waits for the confirm of pending[head] and moves head past it; it
// returns false when the publish ran out of time (ctx) first. amqp091-go
// hands a return to the buffered returns channel before it records the ack
// that follows it (one reader goroutine), so once a message is acked,
// draining the channel tells whether it was returned: an acked message
// that was not is reported at once.
func (w *window) await() bool {
	pd := w.pending[w.head]
	select {
	case <-pd.dc.Done(): // already here: gathered with the others
	default:
		w.groups.waiting()
		for done := false; !done; {
			select {
			case r, ok := <-w.returns:
				w.take(r, ok)
			case <-pd.dc.Done():
				done = true
			case <-w.ctx.Done():
				w.timedOut = true
				return false
			}
		}
	}
	w.head++
	if w.groups.report != nil && pd.dc.Acked() {
		w.drain()
		if _, back := w.returned[w.msgs[pd.i].ID]; !back {
			w.groups.add(pd.i)
		}
	}
	return true
}

// settle decides each message's result once the confirms are in, or the
// channel or the time is gone.
func (w *window) settle() []error {
	p, msgs, errs := w.lane, w.msgs, w.errs
	lost := w.timedOut || w.pubErr != nil || p.ch.IsClosed()
	var closeErr *amqp.Error
	if lost && p.ch.IsClosed() {
		// amqp091-go marks the channel closed before it hands out the
		// reason: wait a moment for it, it decides who is to blame.
		select {
		case closeErr = <-p.chClose:
		case <-time.After(closeReasonWait):
		}
	}
	acked := make([]bool, len(msgs))
	nacked := false
	for _, pd := range w.pending {
		m := &msgs[pd.i]
		select {
		case <-pd.dc.Done():
		default:
			errs[pd.i] = brokerFault(m.ID, ClassTimeout, "no confirm from the broker in time", w.ctx.Err())
			continue
		}
		switch r, ok := w.returned[m.ID]; {
		case ok:
			errs[pd.i] = messageFault(m.ID, ClassUnroutable, fmt.Sprintf("unroutable: no queue is bound to exchange %q for routing key %q (broker replied %d %s); bind a queue (outbox declare), choose AMQPConfig.Unroutable, or change the Router",
				r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
		case pd.dc.Acked():
			acked[pd.i] = true
		case !lost:
			// A nack says the broker could not take the message now (a
			// queue full with overflow reject-publish, a quorum queue
			// electing a leader, an internal error), not that the message
			// is bad: no attempt is counted, and the channel, which may be
			// the one that keeps being refused, is replaced.
			errs[pd.i] = brokerFault(m.ID, ClassNack, "the broker refused the message (nack): a queue may be full with overflow reject-publish, a quorum queue may be electing a leader, or the broker had an internal error", nil)
			nacked = true
		}
	}
	if lost {
		// Whatever the channel took with it is unconfirmed: never published.
		for i := range msgs {
			var pe *PublishError
			if !acked[i] && (errs[i] == nil || errors.As(errs[i], &pe) && pe.BrokerFault) {
				errs[i] = p.blame(&msgs[i], closeErr)
			}
		}
	}
	if lost || nacked {
		p.discard(false)
	}
	return errs
}
