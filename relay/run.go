package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/acemq/outbox"
)

// Run relays messages until ctx ends, then shuts down gracefully: it claims
// nothing more, waits up to Config.ShutdownTimeout for the confirms of the
// batches in flight, marks what was confirmed and releases the rest so that
// another relay can take it at once. It returns nil after such a shutdown.
//
// Failures of the database or the broker do not stop Run: it logs them and
// tries again after a jittered backoff. Failures that will not go away by
// themselves (wrong credentials, a missing database, vhost or table, no
// permission) are retried too, since an operator may fix them while the
// relay runs, but logged at error level as permanent. Run returns an error
// when it is already running, when its publisher was closed
// (ErrPublisherClosed), when the store has no pool (outbox.ErrNoPool) or
// its *sql.DB was closed ("sql: database is closed"), when any of the
// store's methods reports that the table is not an outbox table of this
// version (outbox.ErrInvalidTable: a foreign table, a log table of another
// version, ...), and in ordered mode when the table cannot keep the order
// (outbox.ErrOrderingUnsafe, see outbox.Store.CheckOrdering): those are
// misuse, and cannot change while it runs.
//
// Run is a pipeline of three stages (see the package documentation): one
// claimer, Config.MaxInFlight publishers, one settler.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run called while the relay is already running")
	}
	defer r.running.Store(false)
	if err := r.checkOrdering(ctx); err != nil {
		return err
	}
	r.ordered.Store(r.store.Ordering() == outbox.OrderedByKey)
	r.logger.InfoContext(ctx, "relay: Started", slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease),
		slog.Bool("ordered", r.ordered.Load()), slog.Int("max_in_flight", r.cfg.MaxInFlight))
	if r.ordered.Load() {
		r.logger.InfoContext(ctx, "relay: The table is ordered: relaying each key's messages in commit order, as every relay of an ordered table does, whatever its store's configuration")
	}

	// A fatal error in any stage stops the others through runCtx.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	f := &firstFatal{stop: stopRun}
	stopBeside := r.startBeside(runCtx, f.fail)
	defer stopBeside()
	drain, stopDrain := r.shutdownClock(ctx, runCtx)
	defer stopDrain()
	r.runPipeline(runCtx, drain, f.fail)
	if err := f.get(); err != nil {
		r.logger.ErrorContext(ctx, "relay: Stopped by an error it cannot recover from", slog.String("error", err.Error()))
		return err
	}
	r.logger.InfoContext(context.WithoutCancel(ctx), "relay: Stopped")
	return nil
}

// firstFatal keeps the first error that stops a Run, from whichever goroutine
// meets it, and stops the others.
type firstFatal struct {
	mu   sync.Mutex
	err  error
	stop context.CancelFunc
}

func (f *firstFatal) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = explain(err)
	}
	f.mu.Unlock()
	f.stop()
}

func (f *firstFatal) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// startBeside starts what runs beside the pipeline, each in a goroutine
// of its own until runCtx ends: purging, the storage's upkeep, moving due
// delayed messages, reconciling held ones. Deleting millions of old rows
// must not hold up publishing. Each returns an error only when nothing
// can repair it (a table that is not an outbox table, a closed *sql.DB),
// which it gives to fail. The function returned stops them and waits.
func (r *Relay) startBeside(runCtx context.Context, fail func(error)) (stop func()) {
	var beside sync.WaitGroup
	besideCtx, stopBeside := context.WithCancel(runCtx)
	run := func(f func(context.Context) error) {
		beside.Add(1)
		go func() {
			defer beside.Done()
			if err := f(besideCtx); err != nil {
				fail(err)
			}
		}()
	}
	// periodically runs f every interval until besideCtx ends or f
	// returns an error.
	periodically := func(interval time.Duration, f func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			every(ctx, interval, func(ctx context.Context) {
				if err := f(ctx); err != nil {
					fail(err)
				}
			})
			return nil
		}
	}
	if r.cfg.PurgeAfter > 0 {
		run(periodically(r.cfg.PurgeInterval, r.purge))
	}
	// The storage's upkeep (looks for work to take over, rotation), so
	// that no claim waits for it.
	run(r.maintain)
	// Delayed messages are moved into the table as they fall due, on the
	// clock the store gives (see dueMover).
	if m, ok := r.store.(dueMover); ok {
		run(func(ctx context.Context) error { return r.moveDue(ctx, m) })
	}
	// Ordered mode reconciles held messages every second; unordered mode
	// holds nothing, and brings back, once, what ordered mode held before
	// the table changed modes (the claimer does it again when the table
	// turns unordered while the relay runs).
	run(r.reconcile)
	run(periodically(reconcileInterval, func(ctx context.Context) error {
		if r.ordered.Load() {
			return r.reconcile(ctx)
		}
		return nil
	}))
	return func() {
		stopBeside()
		beside.Wait()
	}
}

// shutdownClock returns the context of the publishes in flight: when
// runCtx ends they get ShutdownTimeout for their confirms, then drain ends
// and cuts them short. Its goroutine is the only owner of that deadline;
// stop ends it.
func (r *Relay) shutdownClock(ctx, runCtx context.Context) (drain context.Context, stop context.CancelFunc) {
	drain, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-runCtx.Done():
			t := time.NewTimer(r.cfg.ShutdownTimeout)
			defer t.Stop()
			select {
			case <-t.C:
				stopDrain()
			case <-drain.Done():
			}
		case <-drain.Done():
		}
	}()
	return drain, stopDrain
}

// runPipeline runs the claimer in this goroutine, MaxInFlight publishers
// and one settler until runCtx ends (or the claimer fails), and returns
// when every batch it claimed is settled or released.
func (r *Relay) runPipeline(runCtx, drain context.Context, fail func(error)) {
	p := &pipeline{
		work: make(chan *batch),
		// Enough room for every event of the batches in flight (their
		// early confirms in groups, and their outcomes): a publisher never
		// waits on the settler while it reads confirms.
		events:  make(chan settleEvent, r.cfg.MaxInFlight*(r.cfg.BatchSize/reportEvery+2)),
		slots:   make(chan struct{}, r.cfg.MaxInFlight),
		settled: make(chan struct{}, 1),
	}
	for range r.cfg.MaxInFlight {
		p.slots <- struct{}{}
	}
	var publishers, settler sync.WaitGroup
	for range r.cfg.MaxInFlight {
		publishers.Add(1)
		go func() {
			defer publishers.Done()
			for b := range p.work {
				o := r.publishBatch(runCtx, drain, b, func(ix []int) { p.events <- settleEvent{b: b, early: ix} })
				p.events <- settleEvent{b: b, final: &o}
			}
		}()
	}
	settler.Add(1)
	go func() {
		defer settler.Done()
		r.settler(runCtx, p, fail)
	}()
	local, unsubscribe := r.store.Subscribe()
	if unsubscribe != nil {
		defer unsubscribe()
	}
	if err := r.claimer(runCtx, drain, p, local); err != nil {
		fail(err)
	}
	close(p.work)
	publishers.Wait()
	close(p.events)
	settler.Wait()
}

// pipeline is what the stages share.
type pipeline struct {
	// work hands a claimed batch to a free publisher.
	work chan *batch
	// events hands the settler, in order for each batch, the messages
	// confirmed while the batch is published and then its outcome.
	events chan settleEvent
	// slots holds a token per batch that may be in flight (claimed and not
	// settled): the claimer takes one before it claims, so that a batch is
	// claimed only when a publisher can take it at once (its lease runs
	// from the claim), and the settler gives it back.
	slots chan struct{}
	// settled tells an idle claimer that a batch was settled: in ordered
	// mode the next messages of its keys may be claimable now.
	settled chan struct{}

	mu     sync.Mutex
	faults int   // batches settled with broker faults since the claimer last looked
	clean  int   // batches settled without
	fault  error // the latest broker fault, for the log
}

// report records how a batch's publish went (the settler's).
func (p *pipeline) report(brokerErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if brokerErr != nil {
		p.faults++
		p.fault = brokerErr
	} else {
		p.clean++
	}
}

// reports returns and clears what the settler reported.
func (p *pipeline) reports() (faults, clean int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	faults, clean, err = p.faults, p.clean, p.fault
	p.faults, p.clean, p.fault = 0, 0, nil
	return faults, clean, err
}

// checkOrdering reads the table's mode, which the store's claims follow,
// and refuses to run on a table that cannot keep the order it is asked for
// (outbox.ErrOrderingUnsafe: a store configured OrderedByKey on a table
// that is not ordered, an ordered table whose seq cannot keep the order).
// A check that fails for a reason nothing can repair while the relay runs
// (a table that is not an outbox table, a closed *sql.DB) stops it too; one
// that fails otherwise (the database is down) is left to the claims.
func (r *Relay) checkOrdering(ctx context.Context) error {
	err := r.store.CheckOrdering(ctx)
	switch {
	case errors.Is(err, outbox.ErrOrderingUnsafe):
		r.logger.ErrorContext(ctx, "relay: Not started: the table cannot keep per-key order", slog.String("error", err.Error()))
		return err
	case fatal(err):
		err = explain(err)
		r.logger.ErrorContext(ctx, "relay: Not started", slog.String("error", err.Error()))
		return err
	case err != nil:
		r.logger.WarnContext(ctx, "relay: Could not check that the table keeps per-key order", slog.String("error", err.Error()))
	}
	return nil
}

// claimer is the first stage, and the only one that decides when to
// claim: it owns polling, wake-ups, backoff and health. It claims while a
// publisher is free: again at once after a claim that filled half a batch
// or more, 3ms after a shorter one (under load a claim then gathers a few
// more messages instead of costing the database a round trip per handful),
// and after an empty one it waits 3ms, doubling up to PollInterval (3ms is
// shortWait: more in a large group); a
// wake-up (or the settle of a batch claimed in ordered mode) cuts those
// waits short, and an empty claim right after a wake-up is made again at
// once. After a failure (its own claim, or a broker fault the settler
// reported) it backs off, and nothing cuts that short. It returns when ctx
// ends, or with an error nothing can repair.
func (r *Relay) claimer(ctx, drain context.Context, p *pipeline, local <-chan struct{}) error {
	c := &claimLoop{r: r, p: p, modeRead: time.Now()}
	if r.idleScale.Load() > 1 {
		// A relay of a group starts idle: after an empty first claim its
		// wait is PollInterval, growing from there, not 3ms.
		for r.shortWait()<<c.idle < r.cfg.PollInterval && c.idle < 30 {
			c.idle++
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.slots:
		}
		// The claimer holds a slot from here on: a batch it hands over
		// takes it along, every other way out gives it back.
		if stop, err := c.prepare(ctx); stop {
			p.slots <- struct{}{}
			return err
		}
		b, err := r.claim(ctx, drain)
		if b == nil {
			p.slots <- struct{}{} // nothing to hand over: the slot stays free
		}
		wait, stop, err := c.next(ctx, b, err)
		if stop {
			return err
		}
		if wait > 0 {
			c.pause(ctx, wait, local)
		}
	}
}

// settler is the third stage, and the only one that writes the outcomes
// to the store: one settle at a time, in the order the publishes ended
// (concurrent settles and claims slow each other down on a small
// database). An error nothing can repair (a closed publisher) goes to
// fail, which stops the claimer; what is still handed over is released.
func (r *Relay) settler(ctx context.Context, p *pipeline, fail func(error)) {
	stopped := false
	var next *settleEvent // an outcome taken from events while early marks were gathered
	for {
		var ev settleEvent
		if next != nil {
			ev, next = *next, nil
		} else {
			var ok bool
			if ev, ok = <-p.events; !ok {
				return
			}
		}
		if ev.final == nil {
			if !stopped {
				next = r.markEarlyGathered(ctx, p, ev)
			}
			continue
		}
		o := *ev.final
		if stopped {
			r.releaseAll(ctx, o.b, ReleasedShutdown)
			p.slots <- struct{}{}
			continue
		}
		res, err := r.settleBatch(ctx, o)
		if err != nil { // stop the claimer before a free slot lets it claim again
			stopped = true
			fail(err)
		}
		r.recordPublish(res.brokerErr)
		p.report(res.brokerErr)
		if o.b.ordered {
			// The next messages of its keys may be claimable now; a
			// batch claimed unordered holds no key back.
			select {
			case p.settled <- struct{}{}:
			default:
			}
		}
		p.slots <- struct{}{}
	}
}

// markEarlyGathered marks published the messages confirmed in ev and in
// the early marks waiting behind it, up to the first outcome, one settle
// per batch: a settler that fell behind the publishers (a busy database,
// a relay catching up on a backlog with every lane publishing full
// batches) catches up in a statement per batch instead of one per group,
// and a relay killed then has fewer confirmed messages not yet marked,
// which are published again. Early marks of a batch come before its
// outcome, and the first outcome stops the gathering (it is returned, to
// be settled next), so that an outcome is never settled before the marks
// that came before it.
func (r *Relay) markEarlyGathered(ctx context.Context, p *pipeline, ev settleEvent) *settleEvent {
	var (
		order []*batch         // nil while nothing waited behind ev: ev alone, as it is
		ix    map[*batch][]int // the indices to mark, per batch
		next  *settleEvent
	)
gather:
	for {
		select {
		case n, ok := <-p.events:
			if !ok {
				break gather
			}
			if n.final != nil {
				next = &n
				break gather
			}
			if order == nil {
				order, ix = []*batch{ev.b}, map[*batch][]int{ev.b: slices.Clone(ev.early)}
			}
			if _, seen := ix[n.b]; !seen {
				order = append(order, n.b)
			}
			ix[n.b] = append(ix[n.b], n.early...)
		default:
			break gather
		}
	}
	if order == nil {
		r.markEarly(ctx, ev.b, ev.early)
		return next
	}
	for _, b := range order {
		r.markEarly(ctx, b, ix[b])
	}
	return next
}

// orderingRefresh is how often the claimer reads the table's mode again.
const orderingRefresh = time.Second

// refreshOrdering reads the table's mode again (the claimer's): a table
// converted while the relay runs is relayed in its new mode from the next
// claim. Until the store has read that a table became ordered, its
// unordered claims take no message with a key (see outbox.Store.Claim).
// It returns an error only when nothing can repair it (see fatal).
func (r *Relay) refreshOrdering(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Lease/3) // as a claim: a hung database does not hold the claimer
	defer cancel()
	err := r.store.CheckOrdering(cctx)
	switch {
	case fatal(err):
		return err
	case err != nil && !errors.Is(err, outbox.ErrOrderingUnsafe):
		return nil // the database: the claim will say
	}
	now := r.store.Ordering() == outbox.OrderedByKey
	if was := r.ordered.Swap(now); was == now {
		return nil
	}
	if now {
		r.logger.InfoContext(ctx, "relay: The table was made ordered: relaying each key's messages in commit order from now on")
		return nil
	}
	attrs := []any{}
	if err != nil {
		attrs = append(attrs, slog.String("warning", err.Error()))
	}
	r.logger.WarnContext(ctx, "relay: The table was made unordered: relaying without per-key order from now on", attrs...)
	return r.reconcile(ctx) // bring back what ordered mode held
}

// logFailure logs a failed round at level, retried after wait. An error
// waiting will not fix is logged at error level as permanent, with advice
// the first time (see Relay.hinted); its repeats say "still".
func (r *Relay) logFailure(ctx context.Context, level slog.Level, msg string, err error, wait time.Duration, attrs ...slog.Attr) {
	attrs = append(attrs, slog.String("error", err.Error()), slog.Duration("retry_in", wait))
	if hint := permanent(err); hint != "" {
		level = slog.LevelError
		if r.hintOnce(hint) {
			msg += " with a permanent error; retrying until it is fixed"
			attrs = append(attrs, slog.String("hint", hint))
		} else {
			msg += " still, with the permanent error advised above; retrying until it is fixed"
		}
		attrs = append(attrs, slog.Bool("permanent", true))
	} else {
		msg += "; retrying"
	}
	r.logger.LogAttrs(ctx, level, msg, attrs...)
}

// hintAgain is how long the advice for one permanent error is logged once:
// a failure that lasts longer is advised again, for whoever reads the
// log from then on.
const hintAgain = 10 * time.Minute

// hintOnce reports whether the advice hint is to be logged now: the first
// time since the last claim that went through, or hintAgain after it was
// last. A failover's read-only node fails every round until the pool has
// left it, and the advice was logged three times in 200 ms.
func (r *Relay) hintOnce(hint string) bool {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	if hint == r.hinted && time.Since(r.hintedAt) < hintAgain {
		return false
	}
	r.hinted, r.hintedAt = hint, time.Now()
	return true
}
