package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acemq/outbox"
)

// Defaults of Config.
const (
	BackoffMaxDefault      = 30 * time.Second
	BatchSizeDefault       = 100
	LeaseDefault           = 30 * time.Second
	PollIntervalDefault    = 100 * time.Millisecond
	PublishTimeoutDefault  = 10 * time.Second
	PurgeIntervalDefault   = time.Hour
	ShutdownTimeoutDefault = 10 * time.Second
	MaxInFlightDefault     = 4
	settleTimeout          = 15 * time.Second
	settleRetryMin         = 25 * time.Millisecond
	settleRetryMax         = time.Second
	backoffMin             = 100 * time.Millisecond
	pollFirst              = time.Millisecond // the first wait after an empty claim
	wakeBurst              = 8                // empty claims 1ms apart after a wake-up
)

// Config configures a Relay. The zero value (and nil) gives the defaults.
type Config struct {
	// BackoffMax is the longest the relay waits before trying again after
	// the broker or the database failed; waits grow from 100ms, jittered.
	// Defaults to 30s.
	BackoffMax time.Duration

	// BatchSize is how many messages one claim takes. Defaults to 100.
	BatchSize int

	// Lease is how long a claim holds. It must be comfortably longer than
	// PublishTimeout: a relay that dies leaves its batch to others after
	// the lease, so it is also the longest a message waits after a crash.
	// Defaults to 30s.
	Lease time.Duration

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MaxInFlight is how many batches may be claimed and not yet settled
	// at once. Each is handled by a lane of its own (claim, publish,
	// settle), so that the next batch is claimed and published while the
	// confirms and marks of the previous one are awaited; settles are
	// applied in claim order. A batch may wait for the settles of the
	// batches claimed before it, within its lease. A Publisher that is not
	// a ConcurrentPublisher is never called concurrently. Defaults to 4.
	MaxInFlight int

	// PollInterval is the longest the relay waits between claims when
	// there is nothing to do: after a claim that found messages it claims
	// again at once; after an empty one it waits 1ms, then twice as long
	// after every further empty claim, up to PollInterval. It is the
	// longest a new message waits without a wake-up. An idle relay makes
	// 1/PollInterval claims a second, each one cheap query on a partial
	// index. Defaults to 100ms.
	PollInterval time.Duration

	// PublishTimeout bounds publishing one batch, confirms included.
	// Messages without a confirm by then are released, not marked.
	// Defaults to 10s, or a third of Lease if that is shorter. Must be
	// shorter than Lease.
	PublishTimeout time.Duration

	// PurgeAfter, when set, makes the relay purge published messages older
	// than this, every PurgeInterval. Defaults to 0: no purging.
	PurgeAfter time.Duration

	// PurgeInterval is how often the relay purges when PurgeAfter is set.
	// Defaults to 1h.
	PurgeInterval time.Duration

	// ShutdownTimeout bounds how long Run, once its context ends, waits for
	// the confirms of the batch in flight before it releases what is
	// unconfirmed. Defaults to 10s.
	ShutdownTimeout time.Duration

	// Wakeup, when not nil, makes the relay look for work at once whenever a
	// value arrives, instead of at the next poll. Feed it from LISTEN/NOTIFY
	// (see package pgwake). Writers in the same process need nothing: a
	// store that offers wake-ups (outbox.Store.Subscribe: every Add on the
	// table in this process) wakes the relay by itself.
	Wakeup <-chan struct{}
}

func (c *Config) withDefaults() Config {
	return Config{
		BackoffMax:      cmp.Or(c.BackoffMax, BackoffMaxDefault),
		BatchSize:       cmp.Or(c.BatchSize, BatchSizeDefault),
		MaxInFlight:     cmp.Or(c.MaxInFlight, MaxInFlightDefault),
		Lease:           cmp.Or(c.Lease, LeaseDefault),
		Logger:          cmp.Or(c.Logger, slog.Default()),
		PollInterval:    cmp.Or(c.PollInterval, PollIntervalDefault),
		PublishTimeout:  cmp.Or(c.PublishTimeout, min(PublishTimeoutDefault, cmp.Or(c.Lease, LeaseDefault)/3)),
		PurgeAfter:      c.PurgeAfter,
		PurgeInterval:   cmp.Or(c.PurgeInterval, PurgeIntervalDefault),
		ShutdownTimeout: cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault),
		Wakeup:          c.Wakeup,
	}
}

func (c *Config) validate() error {
	switch {
	case c.BatchSize < 1:
		return fmt.Errorf("relay: Config.BatchSize must be at least 1 (got %d)", c.BatchSize)
	case c.MaxInFlight < 1:
		return fmt.Errorf("relay: Config.MaxInFlight must be at least 1 (got %d)", c.MaxInFlight)
	case c.BackoffMax < backoffMin:
		return fmt.Errorf("relay: Config.BackoffMax must be at least %s (got %s)", backoffMin, c.BackoffMax)
	case c.Lease < time.Millisecond:
		return fmt.Errorf("relay: Config.Lease must be at least 1ms (got %s)", c.Lease)
	case c.PollInterval <= 0:
		return fmt.Errorf("relay: Config.PollInterval must be positive (got %s)", c.PollInterval)
	case c.PublishTimeout <= 0:
		return fmt.Errorf("relay: Config.PublishTimeout must be positive (got %s)", c.PublishTimeout)
	case c.PublishTimeout >= c.Lease:
		return fmt.Errorf("relay: Config.PublishTimeout (%s) must be shorter than Config.Lease (%s), or another relay may take a batch while it is still being published", c.PublishTimeout, c.Lease)
	case c.PurgeAfter < 0:
		return fmt.Errorf("relay: Config.PurgeAfter must not be negative (got %s)", c.PurgeAfter)
	case c.PurgeInterval <= 0:
		return fmt.Errorf("relay: Config.PurgeInterval must be positive (got %s)", c.PurgeInterval)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("relay: Config.ShutdownTimeout must be positive (got %s)", c.ShutdownTimeout)
	}
	return nil
}

// Relay moves messages from an outbox Store to a Publisher: it claims a
// batch, publishes it, and marks each message published, failed or released,
// over and over until its context ends. Several relays, in one process or
// many, can work on the same table.
type Relay struct {
	store   Store
	pub     Publisher
	cfg     Config
	logger  *slog.Logger
	running atomic.Bool
	stats   counters

	health     atomic.Pointer[Health]
	claimMu    sync.Mutex // one claim at a time, numbered by order
	order      sequencer
	pubMu      sync.Mutex                           // one Publish at a time unless concurrent
	concurrent bool                                 // the publisher may be called from several lanes at once
	backlog    chan struct{}                        // full claims call extra lanes in
	pollFirst  time.Duration                        // the first wait after an empty claim
	backoff    outbox.BackoffFunc                   // waits after broker or database failures
	sleepHook  func(d time.Duration, wakeable bool) // tests: replaces sleeping
}

type counters struct {
	batches, published, failed, released, leasesLost, purged atomic.Int64
}

// Stats are a relay's running totals since it was created.
type Stats struct {
	Batches    int64 // batches claimed (non-empty)
	Published  int64 // messages confirmed and marked published
	Failed     int64 // messages marked failed (an attempt counted)
	Released   int64 // messages given back without an attempt (broker faults, shutdown)
	LeasesLost int64 // messages whose claim had passed to another relay when marked
	Purged     int64 // published messages purged
}

// New returns a relay that takes messages from store and hands them to pub.
// The caller keeps ownership of pub and closes it after Run returns.
func New(store Store, pub Publisher, cfg *Config) (*Relay, error) {
	if isNil(store) {
		return nil, errors.New("relay: New: store is nil")
	}
	if isNil(pub) {
		return nil, errors.New("relay: New: publisher is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	cp, ok := pub.(ConcurrentPublisher)
	return &Relay{store: store, pub: pub, cfg: c, logger: c.Logger, pollFirst: pollFirst, concurrent: ok && cp.Concurrent(),
		backoff: outbox.ExponentialBackoff(backoffMin, c.BackoffMax)}, nil
}

// Stats returns the relay's running totals.
func (r *Relay) Stats() Stats {
	return Stats{
		Batches:    r.stats.batches.Load(),
		Published:  r.stats.published.Load(),
		Failed:     r.stats.failed.Load(),
		Released:   r.stats.released.Load(),
		LeasesLost: r.stats.leasesLost.Load(),
		Purged:     r.stats.purged.Load(),
	}
}

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
// (ErrPublisherClosed) and when the store has no pool (outbox.ErrNoPool):
// those cannot change while it runs.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run called while the relay is already running")
	}
	defer r.running.Store(false)
	r.logger.InfoContext(ctx, "relay: Started", slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease))

	// Purging runs beside the loop: deleting millions of old rows must not
	// hold up publishing.
	var purges sync.WaitGroup
	purgeCtx, stopPurging := context.WithCancel(ctx)
	if _, ok := r.store.(Purger); ok && r.cfg.PurgeAfter > 0 {
		purges.Add(1)
		go func() {
			defer purges.Done()
			r.purgeLoop(purgeCtx)
		}()
	}
	defer purges.Wait()
	defer stopPurging()

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
	r.backlog = make(chan struct{}, r.cfg.MaxInFlight)
	for i := range r.cfg.MaxInFlight {
		lanes.Add(1)
		go func() {
			defer lanes.Done()
			lane := r.lane
			if i > 0 {
				lane = r.extraLane
			}
			if err := lane(laneCtx, local); err != nil {
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
			if hint := permanent(err); hint != "" {
				r.logger.ErrorContext(ctx, "relay: Claiming failed with a permanent error; retrying until it is fixed",
					slog.String("error", err.Error()), slog.String("hint", hint), slog.Bool("permanent", true), slog.Duration("retry_in", wait))
			} else {
				r.logger.ErrorContext(ctx, "relay: Claiming failed; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
			}
		case res.brokerFaults > 0:
			failures++
			wait = r.backoff(failures)
			if hint := permanent(res.brokerErr); hint != "" {
				r.logger.ErrorContext(ctx, "relay: The broker refuses the relay with a permanent error; messages released, retrying until it is fixed",
					slog.Int("num_released", res.brokerFaults), slog.String("error", res.brokerErr.Error()), slog.String("hint", hint),
					slog.Bool("permanent", true), slog.Duration("retry_in", wait))
			} else {
				r.logger.WarnContext(ctx, "relay: Broker unavailable; messages released, retrying",
					slog.Int("num_released", res.brokerFaults), slog.String("error", res.brokerErr.Error()), slog.Duration("retry_in", wait))
			}
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
			r.sleep(ctx, wait) // a backoff is not cut short by new work
		} else if r.sleep(ctx, wait, r.cfg.Wakeup, local) {
			// Woken, maybe before the writer's commit: poll closely for a
			// few milliseconds before the waits grow again.
			idle, burst = 0, wakeBurst
		}
	}
}

// signalBacklog asks an idle extra lane to claim the next batch while this
// one is published, when a claim came back full.
func (r *Relay) signalBacklog(claimed int) {
	if claimed == r.cfg.BatchSize {
		select {
		case r.backlog <- struct{}{}:
		default:
		}
	}
}

// extraLane claims, publishes and settles while claims come back full,
// and waits for a backlog otherwise.
func (r *Relay) extraLane(ctx context.Context, _ <-chan struct{}) error {
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
				r.sleep(ctx, r.backoff(failures))
				break
			}
			failures = 0
			if res.claimed < r.cfg.BatchSize {
				break
			}
		}
	}
}

// Health is what a readiness check needs to know about a running relay.
type Health struct {
	// LastClaim is when the relay last claimed from the store without an
	// error, whether it found messages or not; zero before the first.
	LastClaim time.Time

	// Err is the error of the last round (claiming, or publishing when the
	// broker failed), nil when it went through.
	Err error

	// Permanent is true when Err will not go away by waiting: wrong
	// credentials, a missing database, vhost or table, a privilege
	// missing. A person has to act.
	Permanent bool
}

// Health reports how the relay's last round went. A relay is ready when
// Err is nil and LastClaim is recent (a few poll intervals).
func (r *Relay) Health() Health {
	if h := r.health.Load(); h != nil {
		return *h
	}
	return Health{}
}

func (r *Relay) recordHealth(res result, err error) {
	h := r.Health()
	switch {
	case err != nil:
		h.Err = err
	case res.brokerFaults > 0:
		h.LastClaim, h.Err = time.Now(), res.brokerErr
	default:
		h.LastClaim, h.Err = time.Now(), nil
	}
	h.Permanent = permanent(h.Err) != ""
	r.health.Store(&h)
}

// sleep waits for d, the end of ctx or a wake-up, whichever comes first,
// and reports whether a wake-up ended it.
func (r *Relay) sleep(ctx context.Context, d time.Duration, wakeups ...<-chan struct{}) bool {
	wakeable := false
	for _, w := range wakeups {
		wakeable = wakeable || w != nil
	}
	if r.sleepHook != nil { // tests
		r.sleepHook(d, wakeable)
		return false
	}
	var w1, w2 <-chan struct{}
	if len(wakeups) > 0 {
		w1 = wakeups[0]
	}
	if len(wakeups) > 1 {
		w2 = wakeups[1]
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
	msgs, err := r.store.Claim(ctx, r.cfg.BatchSize, r.cfg.Lease)
	var seq uint64
	if err == nil && len(msgs) > 0 {
		seq = r.order.take()
	}
	r.claimMu.Unlock()
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
		r.release(settleCtx, until, msgs)
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
	errs := r.pub.Publish(pubCtx, msgs)
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
		r.release(settleCtx, until, msgs)
		return result{claimed: len(msgs), brokerFaults: len(msgs), brokerErr: errors.New("publisher returned a wrong number of results")}, nil
	}

	var published, broker []outbox.Message
	type failure struct {
		msg    outbox.Message
		reason string
	}
	var failed []failure
	for i, err := range errs {
		switch {
		case err == nil:
			published = append(published, msgs[i])
		case errors.Is(err, ErrPublisherClosed):
			r.release(settleCtx, until, msgs)
			return res, err
		case errors.Is(err, ErrBrokerUnavailable):
			broker = append(broker, msgs[i])
			if res.brokerErr == nil {
				res.brokerErr = err
			}
		default:
			reason := err.Error()
			var pe *PublishError
			if errors.As(err, &pe) {
				reason = pe.Reason
			}
			failed = append(failed, failure{msgs[i], reason})
		}
	}
	res.brokerFaults = len(broker)

	// Published first: it is what prevents a duplicate. Then failures, then
	// releases.
	if len(published) > 0 {
		err := r.retrying(settleCtx, until, "marking published", func(ctx context.Context) error {
			return r.store.MarkPublished(ctx, published...)
		})
		r.stats.published.Add(r.settled(settleCtx, "marking published", len(published), err))
	}
	for _, f := range failed {
		r.logger.WarnContext(ctx, "relay: Message failed", slog.String("outbox_id", f.msg.ID),
			slog.String("event_type", f.msg.EventType), slog.Int("attempt", f.msg.Attempts+1), slog.String("error", f.reason))
		err := r.retrying(settleCtx, until, "marking failed", func(ctx context.Context) error {
			return r.store.MarkFailed(ctx, f.msg, f.reason)
		})
		r.stats.failed.Add(r.settled(settleCtx, "marking failed", 1, err))
	}
	r.release(settleCtx, until, broker)
	r.logger.DebugContext(ctx, "relay: Batch done", slog.Int("num_claimed", len(msgs)),
		slog.Int("num_published", len(published)), slog.Int("num_failed", len(failed)), slog.Int("num_released", len(broker)))
	return res, nil
}

func (r *Relay) release(ctx context.Context, until time.Time, msgs []outbox.Message) {
	if len(msgs) == 0 {
		return
	}
	err := r.retrying(ctx, until, "releasing", func(ctx context.Context) error {
		return r.store.Release(ctx, msgs...)
	})
	r.stats.released.Add(r.settled(ctx, "releasing", len(msgs), err))
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
		return int64(n - len(lost.IDs)) // the store has logged it
	}
	r.logger.ErrorContext(ctx, "relay: Settling a batch failed; its messages will be retried after the lease",
		slog.String("operation", what), slog.Int("num_messages", n), slog.String("error", err.Error()))
	return 0
}

// purgeLoop purges at once and then every PurgeInterval until ctx ends.
func (r *Relay) purgeLoop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.PurgeInterval)
	defer tick.Stop()
	for {
		r.purge(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *Relay) purge(ctx context.Context) {
	n, err := r.store.(Purger).PurgePublished(ctx, r.cfg.PurgeAfter)
	r.stats.purged.Add(n)
	switch {
	case err != nil && ctx.Err() == nil:
		r.logger.ErrorContext(ctx, "relay: Purging published messages failed", slog.String("error", err.Error()))
	case n > 0:
		r.logger.InfoContext(ctx, "relay: Purged published messages", slog.Int64("num_purged", n), slog.Duration("older_than", r.cfg.PurgeAfter))
	}
}

// isNil reports whether v is nil or an interface holding a nil pointer
// (a (*outbox.Store)(nil), say), which would panic on first use.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// sequencer lets the lanes settle in the order their batches were claimed.
type sequencer struct {
	mu         sync.Mutex
	cond       *sync.Cond
	next, done uint64
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
	if s.cond == nil {
		s.cond = sync.NewCond(&s.mu)
	}
	for s.done < seq-1 {
		s.cond.Wait()
	}
}

// finish records that batch seq has settled, after those before it.
func (s *sequencer) finish(seq uint64) {
	s.wait(seq)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = seq
	s.cond.Broadcast()
}
