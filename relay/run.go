package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/acemq/outbox"
)

// Run relays messages until ctx ends, then shuts down gracefully: it claims
// nothing more, waits up to Config.ShutdownTimeout for the confirms of the
// batch in flight, marks what was confirmed and releases the rest so that
// another relay can take it at once. It returns nil after such a shutdown.
//
// Failures of the database or the broker do not stop Run: it logs them and
// tries again after a jittered backoff. Failures that will not go away by
// themselves (wrong credentials, a missing database, vhost or table, no
// permission) are retried too, since an operator may fix them while the
// relay runs, but logged at error level as permanent. Run returns an error
// when it is already running, when its publisher was closed
// (ErrPublisherClosed), when the store has no pool (outbox.ErrNoPool), and
// in ordered mode when the table cannot keep the order
// (outbox.ErrOrderingUnsafe, see outbox.Store.CheckOrdering): those cannot
// change while it runs.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run called while the relay is already running")
	}
	defer r.running.Store(false)
	if err := r.checkOrdering(ctx); err != nil {
		return err
	}
	r.logger.InfoContext(ctx, "relay: Started", slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease),
		slog.Bool("ordered", r.ordered))

	// Purging and reconciling run beside the loop: deleting millions of old
	// rows must not hold up publishing.
	var beside sync.WaitGroup
	besideCtx, stopBeside := context.WithCancel(ctx)
	defer beside.Wait()
	defer stopBeside()
	run := func(f func(context.Context)) {
		beside.Add(1)
		go func() {
			defer beside.Done()
			f(besideCtx)
		}()
	}
	if _, ok := r.store.(Purger); ok && r.cfg.PurgeAfter > 0 {
		run(func(ctx context.Context) { every(ctx, r.cfg.PurgeInterval, r.purge) })
	}
	if _, ok := r.store.(Reconciler); ok {
		if r.ordered {
			run(func(ctx context.Context) { every(ctx, reconcileInterval, r.reconcile) })
		} else {
			// Unordered mode holds nothing: bring back, once, what an
			// ordered relay held before the table changed modes.
			run(r.reconcile)
		}
	}

	// Writers in this process wake the relay through the store.
	var local <-chan struct{}
	if sub, ok := r.store.(Subscriber); ok {
		ch, cancel := sub.Subscribe()
		defer cancel()
		local = ch
	}

	// MaxInFlight lanes claim, publish and settle side by side: one
	// lane's claim and publish overlap another's confirms and marks. The
	// first lane polls and follows wake-ups; the others join only while
	// claims come back full, so that a relay that keeps up with its writers
	// makes one claim at a time (on two cores, concurrent claims and marks
	// slowed each other down).
	laneCtx, stopLanes := context.WithCancel(ctx)
	defer stopLanes()
	var (
		lanes    sync.WaitGroup
		fatalErr error
		once     sync.Once
	)
	for i := range r.cfg.MaxInFlight {
		lanes.Add(1)
		go func() {
			defer lanes.Done()
			var err error
			if i == 0 {
				err = r.lane(laneCtx, local)
			} else {
				err = r.extraLane(laneCtx)
			}
			if err != nil {
				once.Do(func() { fatalErr = err })
				stopLanes()
			}
		}()
	}
	lanes.Wait()
	if fatalErr != nil {
		r.logger.ErrorContext(ctx, "relay: Stopped by an error it cannot recover from", slog.String("error", fatalErr.Error()))
		return fatalErr
	}
	r.logger.InfoContext(context.WithoutCancel(ctx), "relay: Stopped")
	return nil
}

// checkOrdering refuses to run in ordered mode on a table that cannot keep
// the order (outbox.ErrOrderingUnsafe), when the store can tell. A check
// that fails otherwise (the database is down) is left to the claims.
func (r *Relay) checkOrdering(ctx context.Context) error {
	c, ok := r.store.(interface{ CheckOrdering(context.Context) error })
	if !r.ordered || !ok {
		return nil
	}
	err := c.CheckOrdering(ctx)
	switch {
	case errors.Is(err, outbox.ErrOrderingUnsafe):
		r.logger.ErrorContext(ctx, "relay: Not started: the table cannot keep per-key order", slog.String("error", err.Error()))
		return err
	case err != nil:
		r.logger.WarnContext(ctx, "relay: Could not check that the table keeps per-key order", slog.String("error", err.Error()))
	}
	return nil
}

// lane claims, publishes and settles until ctx ends, and returns the
// error that ends the relay, if one did.
func (r *Relay) lane(ctx context.Context, local <-chan struct{}) error {
	var failures, idle, burst int
	for {
		if ctx.Err() != nil {
			return nil
		}
		res, err := r.runOnce(ctx)
		r.recordHealth(res, err)
		var wait time.Duration
		switch {
		case fatal(err):
			return err
		case ctx.Err() != nil:
			continue
		case err != nil:
			failures++
			wait = r.backoff(failures)
			r.logFailure(ctx, slog.LevelError, "relay: Claiming failed", err, wait)
		case res.brokerFaults > 0:
			failures++
			wait = r.backoff(failures)
			r.logFailure(ctx, slog.LevelWarn, "relay: Broker unavailable, messages released", res.brokerErr, wait,
				slog.Int("num_released", res.brokerFaults))
		case res.claimed > 0:
			failures, idle = 0, 0
			continue // work found: there may be more, claim again at once
		case burst > 0:
			failures = 0
			burst--
			wait = r.pollFirst
		default:
			failures = 0
			wait = min(r.cfg.PollInterval, r.pollFirst<<min(idle, 30))
			idle++
		}
		if failures > 0 {
			r.sleep(ctx, wait, nil, nil) // a backoff is not cut short by new work
		} else if r.sleep(ctx, wait, r.cfg.Wakeup, local) {
			// Woken, maybe before the writer's commit: poll closely for a
			// few milliseconds before the waits grow again.
			idle, burst = 0, wakeBurst
		}
	}
}

// logFailure logs a failed round at level, retried after wait. An error
// waiting will not fix is logged at error level as permanent, with advice.
func (r *Relay) logFailure(ctx context.Context, level slog.Level, msg string, err error, wait time.Duration, attrs ...slog.Attr) {
	attrs = append(attrs, slog.String("error", err.Error()), slog.Duration("retry_in", wait))
	if hint := permanent(err); hint != "" {
		level, msg = slog.LevelError, msg+" with a permanent error; retrying until it is fixed"
		attrs = append(attrs, slog.String("hint", hint), slog.Bool("permanent", true))
	} else {
		msg += "; retrying"
	}
	r.logger.LogAttrs(ctx, level, msg, attrs...)
}

// signalBacklog asks an idle extra lane to claim the next batch while this
// one is published, when a claim came back full, unless extra lanes have
// lately been called in for nothing.
func (r *Relay) signalBacklog(claimed int) {
	if claimed < r.cfg.BatchSize {
		return
	}
	r.extraMu.Lock()
	quiet := time.Now().Before(r.extraQuietUntil)
	r.extraMu.Unlock()
	if !quiet {
		select {
		case r.backlog <- struct{}{}:
		default:
		}
	}
}

// extraFound records whether an extra lane's claim found messages. One
// that found none was called in by a full claim whose followers wait for
// it: in ordered mode, the rest of a key whose first messages are in
// flight. Looking past them again at every full claim would cost the
// database a walk over that key's messages each time, so extra lanes are
// not called in again for a while: a poll interval, doubling while they
// keep finding nothing, up to extraQuietMax.
func (r *Relay) extraFound(found bool) {
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	if found {
		r.extraQuiet = 0
		return
	}
	r.extraQuiet = min(max(2*r.extraQuiet, r.cfg.PollInterval), extraQuietMax)
	r.extraQuietUntil = time.Now().Add(r.extraQuiet)
}

// extraLane claims, publishes and settles while claims come back full,
// and waits for a backlog otherwise.
func (r *Relay) extraLane(ctx context.Context) error {
	var failures int
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.backlog:
		}
		for ctx.Err() == nil {
			res, err := r.runOnce(ctx)
			if fatal(err) {
				return err
			}
			if err != nil || res.brokerFaults > 0 {
				// The first lane logs and reports it; this one backs off.
				failures++
				r.sleep(ctx, r.backoff(failures), nil, nil)
				break
			}
			failures = 0
			r.extraFound(res.claimed > 0)
			if res.claimed < r.cfg.BatchSize {
				break
			}
		}
	}
}

// sleep waits for d, the end of ctx or a value on w1 or w2 (nil: none),
// whichever comes first, and reports whether a wake-up ended it.
func (r *Relay) sleep(ctx context.Context, d time.Duration, w1, w2 <-chan struct{}) bool {
	if r.sleepHook != nil { // tests
		r.sleepHook(d, w1 != nil || w2 != nil)
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	case <-w1:
		return true
	case <-w2:
		return true
	}
	return false
}

// sequencer lets the lanes settle in the order their batches were claimed.
// Its zero value is not usable: newSequencer.
type sequencer struct {
	mu         sync.Mutex
	cond       *sync.Cond
	next, done uint64
}

func newSequencer() *sequencer {
	s := &sequencer{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// take numbers the next claim; the caller holds the claim lock.
func (s *sequencer) take() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	return s.next
}

// wait returns once every batch claimed before seq has settled.
func (s *sequencer) wait(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.awaitTurn(seq)
}

// finish records that batch seq has settled, after those before it.
func (s *sequencer) finish(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.awaitTurn(seq)
	s.done = seq
	s.cond.Broadcast()
}

func (s *sequencer) awaitTurn(seq uint64) {
	for s.done < seq-1 {
		s.cond.Wait()
	}
}
