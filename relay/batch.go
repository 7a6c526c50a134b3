package relay

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/acemq/outbox"
)

type result struct {
	claimed      int
	brokerFaults int
	brokerErr    error
}

// runOnce claims one batch, publishes it and settles every message.
func (r *Relay) runOnce(ctx context.Context) (result, error) {
	// Claims are taken one at a time and numbered, so that settles can
	// follow in claim order whichever lane publishes first.
	r.claimMu.Lock()
	claimStart := time.Now()
	msgs, err := r.store.Claim(ctx, r.cfg.BatchSize, r.cfg.Lease)
	var seq uint64
	if err == nil && len(msgs) > 0 {
		seq = r.order.take()
	}
	r.claimMu.Unlock()
	r.obs.Claimed(ctx, len(msgs), time.Since(claimStart), err)
	if err != nil {
		return result{}, err
	}
	res := result{claimed: len(msgs)}
	if len(msgs) == 0 {
		return res, nil
	}
	defer r.order.finish(seq)
	r.signalBacklog(len(msgs))
	r.stats.batches.Add(1)
	settleCtx, cancelSettle := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancelSettle()
	// Failed settles are retried while the lease leaves time for it.
	until := time.Now().Add(r.cfg.Lease - r.cfg.Lease/4)
	if ctx.Err() != nil {
		r.order.wait(seq)
		_ = r.release(settleCtx, until, msgs, ReleasedShutdown)
		return res, nil
	}

	// The batch is published on a context of its own: shutdown must not cut
	// a publish short, only bound how long its confirms are awaited.
	pubCtx, cancelPub := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancelPub()
	var shutdownTimer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(ctx, func() {
		shutdownTimer.Store(time.AfterFunc(r.cfg.ShutdownTimeout, cancelPub))
	})
	if !r.concurrent { // a Publisher that did not say it may be called concurrently
		r.pubMu.Lock()
	}
	pubStart := time.Now()
	errs := r.publish(pubCtx, msgs)
	confirmed := time.Now()
	if !r.concurrent {
		r.pubMu.Unlock()
	}
	stop()
	if t := shutdownTimer.Load(); t != nil {
		t.Stop()
	}
	r.order.wait(seq) // settles follow claim order
	if len(errs) != len(msgs) {
		r.logger.ErrorContext(ctx, "relay: Publisher returned a wrong number of results; releasing the batch",
			slog.Int("num_messages", len(msgs)), slog.Int("num_results", len(errs)))
		_ = r.release(settleCtx, until, msgs, ReleasedBroker)
		return result{claimed: len(msgs), brokerFaults: len(msgs), brokerErr: errors.New("publisher returned a wrong number of results")}, nil
	}

	var published, broker, heldBack []outbox.Message
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
		case errors.Is(err, errHeldBack):
			heldBack = append(heldBack, msgs[i])
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
	r.obs.Published(ctx, len(published), confirmed.Sub(pubStart))
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
	settleErr = cmp.Or(settleErr, r.release(settleCtx, until, heldBack, ReleasedOrder))
	r.obs.Settled(ctx, time.Since(settleStart), settleErr)
	r.logger.DebugContext(ctx, "relay: Batch done", slog.Int("num_claimed", len(msgs)),
		slog.Int("num_published", len(published)), slog.Int("num_failed", len(failed)), slog.Int("num_released", len(broker)+len(heldBack)))
	return res, nil
}

// errHeldBack is the outcome, in ordered mode, of a message that was not
// published because an earlier message of its key in the batch was not.
var errHeldBack = errors.New("relay: held back behind an earlier message of its key")

// publish hands msgs to the publisher. In ordered mode (a store that says
// outbox.OrderedByKey) it publishes in rounds: the first message of every
// key and every message without a key, then, once the broker confirmed
// them, the second message of each key whose first was confirmed, and so
// on. A message of a key is thus sent only after the broker confirmed the
// one before it, so the queue holds them in order whichever channel or
// connection carries them; keys proceed side by side. A key whose message
// was not confirmed has its later messages held back (errHeldBack); a
// broker fault, a closed publisher or the end of ctx ends the rounds, and
// the messages never sent are held back too.
func (r *Relay) publish(ctx context.Context, msgs []outbox.Message) []error {
	if !r.ordered {
		return r.pub.Publish(ctx, msgs)
	}
	var (
		rounds [][]int // indices into msgs, by place in their key
		place  = make(map[string]int)
	)
	for i := range msgs { // msgs come in the order of seq
		j := 0
		if k := msgs[i].Key; k != "" {
			j = place[k]
			place[k]++
		}
		if j == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[j] = append(rounds[j], i)
	}
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = errHeldBack
	}
	stopped := make(map[string]bool) // keys with a message not confirmed
	for _, round := range rounds {
		batch := make([]outbox.Message, 0, len(round))
		idx := make([]int, 0, len(round))
		for _, i := range round {
			if k := msgs[i].Key; k == "" || !stopped[k] {
				batch = append(batch, msgs[i])
				idx = append(idx, i)
			}
		}
		if len(batch) == 0 {
			break
		}
		res := r.pub.Publish(ctx, batch)
		if len(res) != len(batch) {
			return res // runOnce releases the whole batch
		}
		end := false
		for n, err := range res {
			i := idx[n]
			errs[i] = err
			if err != nil {
				stopped[msgs[i].Key] = true
				end = end || errors.Is(err, ErrBrokerUnavailable) || errors.Is(err, ErrPublisherClosed)
			}
		}
		if end || ctx.Err() != nil {
			// A broker fault, a closed publisher, PublishTimeout or
			// shutdown: the messages of the rounds left were never sent,
			// and are released as held back.
			break
		}
	}
	return errs
}

// release gives msgs back without an attempt and returns the error of the
// release, a lost lease aside.
func (r *Relay) release(ctx context.Context, until time.Time, msgs []outbox.Message, reason string) error {
	if len(msgs) == 0 {
		return nil
	}
	n, err := r.settle(ctx, until, "releasing", len(msgs), func(ctx context.Context) error {
		return r.store.Release(ctx, msgs...)
	})
	r.stats.released.Add(n)
	if n > 0 {
		r.obs.Released(ctx, int(n), reason)
	}
	return err
}

// settle runs a mark or release of n messages, retrying it (see retrying),
// and returns how many were settled and its error, lost leases aside:
// those are counted and reported by settled.
func (r *Relay) settle(ctx context.Context, until time.Time, what string, n int, op func(context.Context) error) (int64, error) {
	err := r.retrying(ctx, until, what, op)
	settled := r.settled(ctx, what, n, err)
	if errors.Is(err, outbox.ErrLeaseLost) {
		return settled, nil
	}
	return settled, err
}

// retrying runs a settle and, when it fails for a reason other than a lost
// lease (a database session terminated, a connection dropped), runs it
// again on a fresh connection of the pool, backing off, until it works or
// the time left before until is too short. Marks and releases are fenced by
// the claim token, so a retry can never touch a row that another relay has
// claimed since; it saves the batch from being published a second time
// after the lease.
func (r *Relay) retrying(ctx context.Context, until time.Time, what string, op func(context.Context) error) error {
	delay := settleRetryMin
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil || errors.Is(err, outbox.ErrLeaseLost) || fatal(err) || ctx.Err() != nil ||
			time.Now().Add(delay).After(until) {
			return err
		}
		r.logger.WarnContext(ctx, "relay: Settling failed; retrying on another connection",
			slog.String("operation", what), slog.Int("attempt", attempt), slog.String("error", err.Error()), slog.Duration("retry_in", delay))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, settleRetryMax)
	}
}

// settled counts lost leases and logs a marking error, and returns how many
// of the n messages were settled. A lost lease means another relay has the
// message now; any other error leaves the messages claimed until their lease
// ends, after which they are published again: a duplicate, never a loss.
func (r *Relay) settled(ctx context.Context, what string, n int, err error) int64 {
	if err == nil {
		return int64(n)
	}
	var lost *outbox.LeaseLostError
	if errors.As(err, &lost) {
		r.stats.leasesLost.Add(int64(len(lost.IDs)))
		r.obs.LeasesLost(ctx, len(lost.IDs))
		return int64(n - len(lost.IDs)) // the store has logged it
	}
	r.logger.ErrorContext(ctx, "relay: Settling a batch failed; its messages will be retried after the lease",
		slog.String("operation", what), slog.Int("num_messages", n), slog.String("error", err.Error()))
	return 0
}
