package relay

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/acemq/outbox"
)

// batch is one claim on its way through the pipeline. Every deadline of
// its publish and its settle derives from its claim time and the lease,
// not from when a stage happens to get to it.
type batch struct {
	msgs      []outbox.Message
	publishBy time.Time // claim + PublishTimeout: the publish, confirms included, ends by then
	leaseEnd  time.Time // claim + Lease: after it another relay may claim the messages
	marked    []bool    // the settler's: messages marked published as their confirms came
	ordered   bool      // claimed in ordered mode: a key's messages are published one confirm after another
}

// settleFloor is the least time a settle gets, whatever is left of the
// lease: marks and releases are fenced by the claim, so trying after the
// lease costs nothing (a lost lease) and may still save a duplicate.
const settleFloor = 5 * time.Second

// settleContext is the context a settle of b starting now runs on, and
// its deadline: the end of the lease, but never less than settleFloor from
// now. It runs past ctx's end, so that what the broker confirmed is
// marked on shutdown.
func (b *batch) settleContext(ctx context.Context, now time.Time) (context.Context, time.Time, context.CancelFunc) {
	until := b.leaseEnd
	if floor := now.Add(settleFloor); floor.After(until) {
		until = floor
	}
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	return sctx, until, cancel
}

type result struct {
	brokerFaults int
	brokerErr    error
}

// claim takes one batch from the store, or nil when none was ready.
//
// The claim runs on drain, not on ctx: a claim cut short by shutdown may
// have committed on the server all the same, and its messages would then
// wait out their lease unseen. Run on drain it returns its batch, which
// the pipeline releases at once. It is bounded by a third of the lease
// all the same (a hung database cannot hold a claim longer): what a
// claim cut off there took, the store gives back at once if it can reach
// the database, or else it is published after its lease; never lost.
func (r *Relay) claim(ctx, drain context.Context) (*batch, error) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(drain, r.cfg.Lease/3)
	defer cancel()
	// The store claims in the mode it read last; a change of mode while it
	// claims (another user of the store read it) makes the batch ordered:
	// publishing an unordered batch in order costs time, not correctness.
	ordered := r.store.Ordering() == outbox.OrderedByKey
	msgs, err := r.store.Claim(cctx, r.cfg.BatchSize, r.cfg.Lease)
	ordered = ordered || r.store.Ordering() == outbox.OrderedByKey
	r.obs.Claimed(ctx, len(msgs), time.Since(start), err)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	r.stats.batches.Add(1)
	return &batch{msgs: msgs, publishBy: start.Add(r.cfg.PublishTimeout), leaseEnd: start.Add(r.cfg.Lease), ordered: ordered}, nil
}

// runOnce claims one batch and processes it, in the caller's goroutine:
// the pipeline's stages one after the other, for tests of a batch's
// settling.
func (r *Relay) runOnce(ctx context.Context) (result, error) {
	b, err := r.claim(ctx, ctx)
	if err != nil || b == nil {
		return result{}, err
	}
	return r.process(ctx, context.WithoutCancel(ctx), b)
}

// settleEvent is what the publishers hand the settler: confirmed messages
// of a batch still being published (early), or the batch's outcome.
type settleEvent struct {
	b     *batch
	early []int    // indices into b.msgs, confirmed
	final *outcome // the publish's result
}

// markEarly marks published the messages of b the broker has confirmed
// while the rest of b is still being published, so that a relay killed
// now publishes again only what was confirmed since. What fails to be
// marked here is marked with the batch's outcome.
func (r *Relay) markEarly(ctx context.Context, b *batch, ix []int) {
	if b.marked == nil {
		b.marked = make([]bool, len(b.msgs))
	}
	msgs, which := make([]outbox.Message, 0, len(ix)), make([]int, 0, len(ix))
	for _, i := range ix {
		if i >= 0 && i < len(b.msgs) && !b.marked[i] {
			msgs, which = append(msgs, b.msgs[i]), append(which, i)
		}
	}
	if len(msgs) == 0 {
		return
	}
	sctx, until, cancel := b.settleContext(ctx, time.Now())
	defer cancel()
	n, err := r.settle(sctx, until, "marking published", len(msgs), func(ctx context.Context) error {
		return r.store.MarkPublished(ctx, msgs...)
	})
	r.stats.published.Add(n)
	if err == nil { // marked, or their lease was lost (counted): done with either way
		for _, i := range which {
			b.marked[i] = true
		}
	}
}

// releaseAll gives a batch back without publishing it.
func (r *Relay) releaseAll(ctx context.Context, b *batch, reason string) {
	sctx, until, cancel := b.settleContext(ctx, time.Now())
	defer cancel()
	_ = r.release(sctx, until, b.unmarked(), reason)
}

// unmarked returns the messages of b not marked published yet.
func (b *batch) unmarked() []outbox.Message {
	if b.marked == nil {
		return b.msgs
	}
	out := make([]outbox.Message, 0, len(b.msgs))
	for i, m := range b.msgs {
		if !b.marked[i] {
			out = append(out, m)
		}
	}
	return out
}

// outcome is a published batch on its way to the settler: one error per
// message, and when the publish ended.
type outcome struct {
	b                   *batch
	errs                []error
	pubStart, confirmed time.Time
	shutdown            bool // claimed as the relay stopped: nothing was published
}

// process publishes a batch and settles it, one stage after the other.
func (r *Relay) process(ctx, drain context.Context, b *batch) (result, error) {
	return r.settleBatch(ctx, r.publishBatch(ctx, drain, b, nil))
}

// publishBatch publishes a batch. The publish runs on drain, which ends
// ShutdownTimeout after ctx (shutdown waits that long for confirms, no
// longer), and ends by b.publishBy.
// report, when not nil, is told of confirmed messages as their confirms
// arrive (with a ConfirmingPublisher).
func (r *Relay) publishBatch(ctx, drain context.Context, b *batch, report func([]int)) outcome {
	if ctx.Err() != nil { // claimed as the relay stopped: give it back at once
		return outcome{b: b, shutdown: true}
	}
	pubCtx, cancelPub := context.WithDeadline(drain, b.publishBy)
	defer cancelPub()
	// A dial in progress when the shutdown begins ends then, not with drain.
	pubCtx = withShutdown(pubCtx, ctx)
	if !r.concurrent { // a Publisher that did not say it may be called concurrently
		r.pubMu.Lock()
		defer r.pubMu.Unlock()
	}
	o := outcome{b: b, pubStart: time.Now()}
	o.errs = r.publish(pubCtx, b.ordered, b.msgs, report)
	o.confirmed = time.Now()
	return o
}

// settleBatch settles every message of a published batch: published,
// failed (an attempt counted) or released. It runs past ctx's end, until
// the batch's settleBy, so that what the broker confirmed is marked.
func (r *Relay) settleBatch(ctx context.Context, o outcome) (result, error) {
	b, msgs, errs, confirmed := o.b, o.b.msgs, o.errs, o.confirmed
	var res result
	if o.shutdown {
		r.releaseAll(ctx, b, ReleasedShutdown)
		return res, nil
	}
	settleCtx, until, cancelSettle := b.settleContext(ctx, confirmed)
	defer cancelSettle()
	if len(errs) != len(msgs) {
		r.logger.ErrorContext(ctx, "relay: Publisher returned a wrong number of results; releasing the batch",
			slog.Int("num_messages", len(msgs)), slog.Int("num_results", len(errs)))
		_ = r.release(settleCtx, until, b.unmarked(), ReleasedBroker)
		return result{brokerFaults: len(msgs), brokerErr: errors.New("publisher returned a wrong number of results")}, nil
	}

	// Mostly every message is confirmed: room for them all, once. What is
	// to be marked published is what was confirmed, less what markEarly
	// marked as its confirm came: when it marked nothing, the same slice.
	confirmedMsgs := make([]outbox.Message, 0, len(msgs))
	var published, broker, notSent []outbox.Message
	type failure struct {
		msg           outbox.Message
		reason, class string
	}
	var failed []failure
	for i, err := range errs {
		switch {
		case err == nil:
			confirmedMsgs = append(confirmedMsgs, msgs[i])
			if b.marked != nil && !b.marked[i] {
				published = append(published, msgs[i])
			}
		case errors.Is(err, ErrPublisherClosed):
			_ = r.release(settleCtx, until, b.unmarked(), ReleasedShutdown)
			return res, err
		case errors.Is(err, errNotSent):
			notSent = append(notSent, msgs[i])
		case errors.Is(err, ErrBrokerUnavailable):
			broker = append(broker, msgs[i])
			if res.brokerErr == nil {
				res.brokerErr = err
			}
		default:
			reason, class := err.Error(), ClassOther
			var pe *PublishError
			if errors.As(err, &pe) {
				reason, class = pe.Reason, cmp.Or(pe.Class, ClassOther)
			}
			failed = append(failed, failure{msgs[i], reason, class})
		}
	}
	if b.marked == nil {
		published = confirmedMsgs
	}
	res.brokerFaults = len(broker)
	r.obs.Published(ctx, len(confirmedMsgs), confirmed.Sub(o.pubStart))
	for i := range confirmedMsgs {
		r.obs.Lag(ctx, &confirmedMsgs[i], confirmed.Sub(confirmedMsgs[i].CreatedAt))
	}

	// Published first: it is what prevents a duplicate. Then failures, then
	// releases.
	settleStart := time.Now()
	var settleErr error
	if len(published) > 0 {
		n, err := r.settle(settleCtx, until, "marking published", len(published), func(ctx context.Context) error {
			return r.store.MarkPublished(ctx, published...)
		})
		r.stats.published.Add(n)
		settleErr = cmp.Or(settleErr, err)
	}
	for _, f := range failed {
		r.logger.WarnContext(ctx, "relay: Message failed", slog.String("outbox_id", f.msg.ID),
			slog.String("event_type", f.msg.EventType), slog.Int("attempt", f.msg.Attempts+1), slog.String("error", f.reason))
		n, err := r.settle(settleCtx, until, "marking failed", 1, func(ctx context.Context) error {
			return r.store.MarkFailed(ctx, f.msg, f.reason)
		})
		if n == 1 {
			r.stats.failed.Add(1)
			r.obs.Failed(ctx, &f.msg, f.class, r.maxAttempts > 0 && f.msg.Attempts+1 >= r.maxAttempts)
		}
		settleErr = cmp.Or(settleErr, err)
	}
	reason := ReleasedBroker
	if ctx.Err() != nil {
		reason = ReleasedShutdown
	}
	settleErr = cmp.Or(settleErr, r.release(settleCtx, until, broker, reason))
	settleErr = cmp.Or(settleErr, r.release(settleCtx, until, notSent, ReleasedOrder))
	r.obs.Settled(ctx, time.Since(settleStart), settleErr)
	// Published: what the broker confirmed, marked as the confirms came
	// (markEarly) or here.
	if r.logger.Enabled(ctx, slog.LevelDebug) {
		r.logger.DebugContext(ctx, "relay: Batch done", slog.Int("num_claimed", len(msgs)),
			slog.Int("num_published", len(confirmedMsgs)), slog.Int("num_failed", len(failed)), slog.Int("num_released", len(broker)+len(notSent)),
			slog.String("first_id", msgs[0].ID), slog.Time("claimed", b.leaseEnd.Add(-r.cfg.Lease)),
			slog.Duration("publish", confirmed.Sub(o.pubStart)), slog.Duration("settle", time.Since(settleStart)))
	}
	if fatal(settleErr) { // a closed *sql.DB: stop the relay
		return res, settleErr
	}
	return res, nil
}
