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
	claimed   time.Time // when the claim was made: the lease runs from here
	publishBy time.Time // claimed + PublishTimeout: the publish, confirms included, ends by then
	leaseEnd  time.Time // claimed + Lease: after it another relay may claim the messages
}

// settleFloor is the least time a settle gets, whatever is left of the
// lease: marks and releases are fenced by the claim, so trying after the
// lease costs nothing (a lost lease) and may still save a duplicate.
const settleFloor = 5 * time.Second

// settleBy is when the settle of b gives up: at the end of the lease, but
// never less than settleFloor from now.
func (b *batch) settleBy(now time.Time) time.Time {
	return maxTime(b.leaseEnd, now.Add(settleFloor))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type result struct {
	claimed      int
	brokerFaults int
	brokerErr    error
}

// claim takes one batch from the store, or nil when none was ready.
func (r *Relay) claim(ctx context.Context) (*batch, error) {
	start := time.Now()
	msgs, err := r.store.Claim(ctx, r.cfg.BatchSize, r.cfg.Lease)
	r.obs.Claimed(ctx, len(msgs), time.Since(start), err)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	r.stats.batches.Add(1)
	return &batch{msgs: msgs, claimed: start, publishBy: start.Add(r.cfg.PublishTimeout), leaseEnd: start.Add(r.cfg.Lease)}, nil
}

// runOnce claims one batch and processes it, in the caller's goroutine:
// the pipeline's two stages one after the other, for tests of a batch's
// settling.
func (r *Relay) runOnce(ctx context.Context) (result, error) {
	b, err := r.claim(ctx)
	if err != nil || b == nil {
		return result{}, err
	}
	return r.process(ctx, context.WithoutCancel(ctx), b)
}

// releaseAll gives a batch back without publishing it.
func (r *Relay) releaseAll(ctx context.Context, b *batch, reason string) {
	until := b.settleBy(time.Now())
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	_ = r.release(sctx, until, b.msgs, reason)
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
	return r.settleBatch(ctx, r.publishBatch(ctx, drain, b))
}

// publishBatch publishes a batch. The publish runs on drain, which ends
// ShutdownTimeout after ctx (shutdown waits that long for confirms, no
// longer), and ends by b.publishBy.
func (r *Relay) publishBatch(ctx, drain context.Context, b *batch) outcome {
	if ctx.Err() != nil { // claimed as the relay stopped: give it back at once
		return outcome{b: b, shutdown: true}
	}
	pubCtx, cancelPub := context.WithDeadline(drain, b.publishBy)
	defer cancelPub()
	if !r.concurrent { // a Publisher that did not say it may be called concurrently
		r.pubMu.Lock()
		defer r.pubMu.Unlock()
	}
	o := outcome{b: b, pubStart: time.Now()}
	o.errs = r.publish(pubCtx, b.msgs)
	o.confirmed = time.Now()
	return o
}

// settleBatch settles every message of a published batch: published,
// failed (an attempt counted) or released. It runs past ctx's end, until
// the batch's settleBy, so that what the broker confirmed is marked.
func (r *Relay) settleBatch(ctx context.Context, o outcome) (result, error) {
	b, msgs, errs, confirmed := o.b, o.b.msgs, o.errs, o.confirmed
	res := result{claimed: len(msgs)}
	if o.shutdown {
		r.releaseAll(ctx, b, ReleasedShutdown)
		return res, nil
	}
	until := b.settleBy(confirmed)
	settleCtx, cancelSettle := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancelSettle()
	if len(errs) != len(msgs) {
		r.logger.ErrorContext(ctx, "relay: Publisher returned a wrong number of results; releasing the batch",
			slog.Int("num_messages", len(msgs)), slog.Int("num_results", len(errs)))
		_ = r.release(settleCtx, until, msgs, ReleasedBroker)
		return result{claimed: len(msgs), brokerFaults: len(msgs), brokerErr: errors.New("publisher returned a wrong number of results")}, nil
	}

	var published, broker, notSent []outbox.Message
	type failure struct {
		msg           outbox.Message
		reason, class string
	}
	var failed []failure
	for i, err := range errs {
		switch {
		case err == nil:
			published = append(published, msgs[i])
		case errors.Is(err, ErrPublisherClosed):
			_ = r.release(settleCtx, until, msgs, ReleasedShutdown)
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
	res.brokerFaults = len(broker)
	r.obs.Published(ctx, len(published), confirmed.Sub(o.pubStart))
	for i := range published {
		r.obs.Lag(ctx, &published[i], confirmed.Sub(published[i].CreatedAt))
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
	r.logger.DebugContext(ctx, "relay: Batch done", slog.Int("num_claimed", len(msgs)),
		slog.Int("num_published", len(published)), slog.Int("num_failed", len(failed)), slog.Int("num_released", len(broker)+len(notSent)))
	return res, nil
}
