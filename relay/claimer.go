package relay

import (
	"context"
	"log/slog"
	"time"
)

// claimLoop is the claimer's state from one claim to the next (see
// Relay.claimer): the claimer goroutine alone reads and writes it.
type claimLoop struct {
	r *Relay
	p *pipeline

	failures int       // failures in a row (failed claims, batches with broker faults): the backoff grows with them
	idle     int       // empty claims in a row: the wait after the next one grows with them
	burst    int       // claims still to make closely after a wake-up
	again    bool      // an empty claim is made again at once: a writer of this process woke the claimer before its commit
	modeRead time.Time // when the table's ordering mode was read last
	modeDue  bool      // the mode is to be read after the next claim that finds messages (an idle relay of a group)
}

// prepare does what comes before a claim: reading the table's mode again
// when it is due, and backing off after broker faults the settler
// reported. stop says that the claimer must return, with err (nil when the
// relay is stopping).
func (c *claimLoop) prepare(ctx context.Context) (stop bool, err error) {
	r, p := c.r, c.p
	if time.Since(c.modeRead) >= orderingRefresh {
		if r.idling() {
			// An idle relay of a group reads the mode only when a claim
			// finds messages, before it hands them on (see recheck): a
			// thousand idle tables do not read theirs before every claim.
			c.modeDue = true
		} else {
			c.modeRead, c.modeDue = time.Now(), false
			if err := r.refreshOrdering(ctx); err != nil {
				return true, err
			}
		}
	}
	switch faults, clean, ferr := p.reports(); {
	case faults > 0:
		// A batch met a broker fault: back off before the next claim,
		// which would most likely meet it too.
		c.failures++
		wait := r.backoff(c.failures)
		r.logFailure(ctx, slog.LevelWarn, "relay: Broker unavailable, messages released", ferr, wait, slog.Int("num_batches", faults))
		r.brokerBackoff(ctx, wait) // not cut short by new work; cut short when the broker is back
	case clean > 0:
		c.failures = 0 // the broker is back
	}
	select { // only a settle after this claim may wake the claimer
	case <-p.settled:
	default:
	}
	// A free slot and the shutdown were both ready, and select chose the
	// slot (or the shutdown came during the backoff): claim nothing once
	// the shutdown has begun (the claim runs on drain, and would take back
	// what the settler has just released).
	return ctx.Err() != nil, nil
}

// next hands the claimed batch b (nil: none) to a publisher and decides
// what comes after the claim: how long to wait for work before the next
// (0: claim again at once), or, with stop, that the claimer must return
// with err. A failed claim backs off here, and nothing cuts that short.
func (c *claimLoop) next(ctx context.Context, b *batch, err error) (wait time.Duration, stop bool, _ error) {
	r, p := c.r, c.p
	retry := c.again
	c.again = false
	if ctx.Err() == nil {
		r.recordClaim(err)
	}
	switch {
	case fatal(err):
		return 0, true, err
	case ctx.Err() != nil:
		if b != nil {
			p.work <- b // the settler releases it: shutdown
		}
		return 0, true, nil
	case err != nil:
		c.failures++
		wait := r.backoff(c.failures)
		r.logFailure(ctx, slog.LevelError, "relay: Claiming failed", err, wait)
		r.sleep(ctx, wait, nil, nil, nil) // a backoff is not cut short by new work
		return 0, false, nil
	case b != nil:
		if keep, err := c.recheck(ctx, b); !keep {
			p.slots <- struct{}{}
			return 0, err != nil, err
		}
		p.work <- b
		// The commit a wake-up announced is found (or another's, and the
		// short waits below find the rest): the burst is over.
		c.idle, c.burst = 0, 0
		r.busy.Store(true)
		if len(b.msgs) >= r.cfg.BatchSize/2 {
			return 0, false, nil // there may be more: claim again at once while a publisher is free
		}
		return r.shortWait(), false, nil // a short batch: let a few more messages come
	case c.burst > 0:
		c.failures = 0
		c.burst--
		if retry {
			// The claim after a writer's wake-up in this process found
			// nothing: it most likely ran before the writer's commit (Add
			// wakes as it inserts), which has landed by the end of a
			// claim's round trip.
			return 0, false, nil
		}
		return r.shortWait(), false, nil
	default:
		c.failures = 0
		// shortWait doubled c.idle times, stopping at the longest wait
		// (shifting a long shortWait would overflow)
		wait, longest := r.shortWait(), r.cfg.PollInterval*time.Duration(max(r.idleScale.Load(), 1))
		for i := 0; i < c.idle && wait < longest; i++ {
			wait *= 2
		}
		if wait >= r.cfg.PollInterval {
			r.busy.Store(false)
			wait = min(wait, r.idleWait(r.cfg.PollInterval))
		}
		c.idle++
		return wait, false, nil
	}
}

// recheck reads the table's mode, when it is due, before the claimed batch
// b is handed on; a batch claimed unordered from a table that turned
// ordered meanwhile is released, without an attempt, to be claimed again
// in order. keep false: b was released (or err, which stops the claimer).
func (c *claimLoop) recheck(ctx context.Context, b *batch) (keep bool, err error) {
	if !c.modeDue {
		return true, nil
	}
	c.modeRead, c.modeDue = time.Now(), false
	if err := c.r.refreshOrdering(ctx); err != nil {
		c.r.releaseAll(ctx, b, ReleasedOrder)
		return false, err
	}
	if b.ordered || !c.r.ordered.Load() {
		return true, nil
	}
	c.r.releaseAll(ctx, b, ReleasedOrder)
	return false, nil
}

// pause waits up to wait for work: a wake-up from a writer of this process
// (local), from another (Config.Wakeup) or the settle of an ordered batch
// ends it early.
func (c *claimLoop) pause(ctx context.Context, wait time.Duration, local <-chan struct{}) {
	switch c.r.sleep(ctx, wait, local, c.r.cfg.Wakeup, c.p.settled) {
	case wokenFirst:
		// Woken by a writer of this process, before its commit: claim,
		// then again at once, then poll closely for a few milliseconds
		// before the waits grow again.
		c.idle, c.burst, c.again = 0, wakeBurst, true
	case wokenOther:
		// Another process's commit (Config.Wakeup) or a settled ordered
		// batch.
		c.idle, c.burst = 0, wakeBurst
	}
}
