package relay

import (
	"cmp"
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
	LeaseMin               = time.Second // shorter leases run out under an ordinary batch
	PollIntervalDefault    = 100 * time.Millisecond
	PollIntervalMin        = time.Millisecond // shorter, an idle relay claims thousands of times a second
	PublishTimeoutDefault  = 10 * time.Second
	PurgeIntervalDefault   = time.Hour
	ShutdownTimeoutDefault = 10 * time.Second
	MaxInFlightDefault     = 4
	settleRetryMin         = 25 * time.Millisecond
	settleRetryMax         = time.Second
	backoffMin             = 100 * time.Millisecond
	probeFirst             = 250 * time.Millisecond // see brokerBackoff
	probeMax               = 2 * time.Second
	pollFirst              = 3 * time.Millisecond // the wait after a short or an empty claim
	wakeBurst              = 8                    // empty claims pollFirst apart after a wake-up
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
	// At least LeaseMin (1s). Defaults to 30s.
	Lease time.Duration

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MaxInFlight is how many batches may be claimed and not yet settled
	// at once: the relay's publishers, each publishing a batch (on a
	// connection of its own with AMQPPublisher), while the claimer claims
	// the next for a free publisher and the settler settles the last. A Publisher that is not a
	// ConcurrentPublisher is never called concurrently. Defaults to 4.
	MaxInFlight int

	// Observer sees claims, publishes, failures, releases, lost leases,
	// settles and every published message's lag, for metrics. Defaults to
	// none.
	Observer Observer

	// PollInterval is the longest the relay waits between claims when
	// there is nothing to do: after a claim that found messages it claims
	// again at once; after an empty one it waits 3ms, then twice as long
	// after every further empty claim, up to PollInterval. It is the
	// longest a new message waits without a wake-up. An idle relay makes
	// 1/PollInterval claims a second, each one cheap query on a partial
	// index. At least PollIntervalMin (1ms). Defaults to 100ms.
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
		Observer:        c.Observer,
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
	case c.Lease < LeaseMin:
		return fmt.Errorf("relay: Config.Lease must be at least %s (got %s): a batch still being published or marked when its lease runs out is published again by another relay", LeaseMin, c.Lease)
	case c.PollInterval < PollIntervalMin:
		return fmt.Errorf("relay: Config.PollInterval must be at least %s (got %s): an idle relay claims once per PollInterval, so a shorter one makes thousands of database transactions a second that find nothing", PollIntervalMin, c.PollInterval)
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

	healthMu    sync.Mutex // guards the five below
	lastClaim   time.Time  // the last claim that went through
	claimErr    error      // the last claim's error
	brokerErr   error      // the last publish's broker fault
	hinted      string     // the advice last logged, until a claim goes through (hintOnce)
	hintedAt    time.Time  // when it was
	obs         Observer
	maxAttempts int                                        // the store's, when it says; for Observer.Failed's parked
	pubMu       sync.Mutex                                 // one Publish at a time unless concurrent
	concurrent  bool                                       // the publisher may be called from several publishers at once
	ordered     atomic.Bool                                // the claimer's: the table's mode, as last read
	pollFirst   time.Duration                              // the wait after a short or an empty claim
	backoff     outbox.BackoffFunc                         // waits after broker or database failures
	sleepHook   func(d time.Duration, wakeable bool) woken // tests: replaces sleeping, and says what ended it
	idleScale   atomic.Int64                               // a Group's factor on the waits while idle (0, 1: none)
	busy        atomic.Bool                                // the claimer's claims find work (until its waits are at their longest again)
}

// idleWait is d, the wait between two of the relay's looks (claims,
// Maintain, delayed messages), grown by its group's factor unless the
// relay is busy (see GroupConfig.IdleClaims). A relay of a group starts
// idle: a thousand tables starting at once must not look at the database
// at a busy relay's pace.
func (r *Relay) idleWait(d time.Duration) time.Duration {
	if r.idling() {
		return d * time.Duration(r.idleScale.Load())
	}
	return d
}

// shortWait is the first of the claimer's short waits: after a short
// batch, after an empty claim (doubling from there) and between the claims
// of a burst after a wake-up. It is pollFirst, grown by its group's factor
// (see GroupConfig.IdleClaims) up to a quarter of PollInterval: a hundred
// tables that each write a few events a second would otherwise each claim
// a dozen times after every event, and together ask the database for more
// claims than it can serve.
func (r *Relay) shortWait() time.Duration {
	return max(r.pollFirst, min(r.pollFirst*time.Duration(max(r.idleScale.Load(), 1)), r.cfg.PollInterval/4))
}

// idling says whether the relay's waits are grown: it is an idle relay of
// a group large enough to grow them.
func (r *Relay) idling() bool { return r.idleScale.Load() > 1 && !r.busy.Load() }

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
	var obs Observer = NopObserver{}
	if !isNil(c.Observer) {
		obs = c.Observer
	}
	return &Relay{store: store, pub: pub, cfg: c, logger: c.Logger, pollFirst: pollFirst, concurrent: ok && cp.Concurrent(),
		obs: obs, maxAttempts: store.MaxAttempts(),
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

// Health reports how the relay is doing: its last claim, and the error of
// its last claim or, when that went through, of its last publish. A relay
// is ready when Err is nil and LastClaim is recent (a few poll intervals).
func (r *Relay) Health() Health {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	h := Health{LastClaim: r.lastClaim, Err: cmp.Or(r.claimErr, r.brokerErr)}
	h.Permanent = permanent(h.Err) != ""
	return h
}

// recordClaim records a claim's outcome (the claimer's).
func (r *Relay) recordClaim(err error) {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	r.claimErr = err
	if err == nil {
		r.lastClaim = time.Now()
		r.hinted = ""
	}
}

// recordPublish records whether a batch met a broker fault (the settler's).
func (r *Relay) recordPublish(brokerErr error) {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	r.brokerErr = brokerErr
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
