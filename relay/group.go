package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/acemq/outbox/internal/periodic"
)

// IdleClaimsDefault is GroupConfig.IdleClaims's default: what ten idle
// relays of PollIntervalDefault claim a second.
const IdleClaimsDefault = 100

// GroupConfig configures a Group.
type GroupConfig struct {
	// Config is every table's relay's configuration. Its Wakeup must be
	// nil (a wake-up is a table's: Table.Wakeup); its Observer sees the
	// tables that have none of their own (Table.Observer).
	Config

	// IdleClaims bounds how many claims a second the group's idle tables
	// make together, and so what a thousand idle tables cost the database:
	// while more than IdleClaims × Config.PollInterval tables are in the
	// group, each table's longest wait between claims grows with their
	// number (n / IdleClaims seconds), and so do its relay's other looks
	// while it is idle (Store.Maintain, delayed messages). A write in this
	// process, or the table's Wakeup, ends the wait at once. The short
	// waits of a table that is not idle (after a short batch, after an
	// empty claim, between the claims after a wake-up) grow by the same
	// factor, up to a quarter of PollInterval: a hundred tables writing a
	// few events a second each would otherwise claim a dozen times an
	// event. Defaults to IdleClaimsDefault (100).
	IdleClaims float64

	// KeepRunning makes Run return only when its context ends, even when
	// every table's relay has stopped on an error: for a group whose
	// tables come and go (outbox relay --tables), where a table dropped
	// is let go by its caller, and another may be added next.
	KeepRunning bool
}

// Table is one table of a Group.
type Table struct {
	// Name names the table in the group (Remove, Health, Stats) and in its
	// relay's logs; unique in the group. Use the table's name.
	Name string

	// Store is the table's store. The stores of a group may share one
	// *sql.DB.
	Store Store

	// Wakeup, when not nil, wakes the table's relay as Config.Wakeup
	// wakes a relay (LISTEN/NOTIFY on the table's channel, see pgwake).
	Wakeup <-chan struct{}

	// Observer sees the table's relay, as Config.Observer sees a relay;
	// defaults to the group's.
	Observer Observer
}

// Group relays several outbox tables from one process: a schema per
// tenant, an outbox per module. Each table has a Relay of its own (its
// claimer, Config.MaxInFlight publishers, its settler: the pipeline of
// the package documentation), and every table publishes through the
// group's one Publisher, so the stores may share one *sql.DB and the
// tables share the publisher's broker connections (bound them with
// AMQPConfig.MaxConnections). Tables join and leave while it runs.
//
// No table holds up another: a table with a backlog has at most
// Config.MaxInFlight batches claimed at once, like any other, and its
// claims are its own; what the tables share is the publisher and the
// database. One table's failure (dropped, no permission) is its own: its
// relay retries or stops, and Health says which table fails; the others
// go on.
//
// What tables cost idle is bounded by GroupConfig.IdleClaims.
type Group struct {
	pub    Publisher
	cfg    Config
	idle   float64
	keep   bool
	logger *slog.Logger

	mu      sync.Mutex
	members map[string]*member
	gone    Stats           // the totals of the tables removed
	runCtx  context.Context // while Run runs; nil otherwise
	running sync.WaitGroup  // the members' Runs
	stopped chan struct{}   // a member's Run returned (Run looks whether any is left)
}

// member is a table of a group and its relay.
type member struct {
	r    *Relay
	stop context.CancelFunc // nil while not running
	done chan struct{}      // closed when its Run returned
	err  error              // what its Run returned, once done
}

// NewGroup returns a group that publishes to pub, with no table yet. The
// caller keeps ownership of pub and closes it after Run returns.
func NewGroup(pub Publisher, cfg *GroupConfig) (*Group, error) {
	if isNil(pub) {
		return nil, errors.New("relay: NewGroup: publisher is nil")
	}
	if cfg == nil {
		cfg = &GroupConfig{}
	}
	if cfg.Wakeup != nil {
		return nil, errors.New("relay: GroupConfig.Wakeup must be nil: a wake-up is a table's (Table.Wakeup)")
	}
	if cfg.IdleClaims < 0 || math.IsNaN(cfg.IdleClaims) || math.IsInf(cfg.IdleClaims, 0) {
		return nil, fmt.Errorf("relay: GroupConfig.IdleClaims must be positive (got %v)", cfg.IdleClaims)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Group{pub: pub, cfg: c, idle: cmp.Or(cfg.IdleClaims, IdleClaimsDefault), keep: cfg.KeepRunning, logger: c.Logger,
		members: map[string]*member{}, stopped: make(chan struct{}, 1)}, nil
}

// Add adds a table to the group; while Run runs, its relay starts at once.
// A name already in the group is an error.
func (g *Group) Add(t Table) error {
	if t.Name == "" {
		return errors.New("relay: Group.Add: the table has no name")
	}
	cfg := g.cfg
	cfg.Wakeup = t.Wakeup
	cfg.Logger = g.logger.With(slog.String("table", t.Name))
	if !isNil(t.Observer) {
		cfg.Observer = t.Observer
	}
	r, err := New(t.Store, g.pub, &cfg)
	if err != nil {
		return fmt.Errorf("relay: Group.Add %s: %w", t.Name, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.members[t.Name]; ok {
		return fmt.Errorf("relay: Group.Add: %s is in the group already", t.Name)
	}
	m := &member{r: r}
	g.members[t.Name] = m
	g.rescale()
	if g.runCtx != nil {
		g.start(m, 0)
	}
	return nil
}

// Remove takes a table out of the group. While Run runs, its relay shuts
// down as Run's does (what it published is marked, the rest released for
// another relay) and Remove returns when it has. It reports whether the
// table was in the group.
func (g *Group) Remove(name string) bool {
	g.mu.Lock()
	m, ok := g.members[name]
	if ok {
		delete(g.members, name)
		g.rescale()
	}
	g.mu.Unlock()
	if ok && m.stop != nil {
		m.stop()
		<-m.done
	}
	if ok {
		g.mu.Lock()
		g.gone = g.gone.plus(m.r.Stats())
		g.mu.Unlock()
	}
	return ok
}

// Tables returns the names of the group's tables, sorted.
func (g *Group) Tables() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.members))
}

// Health reports how each table's relay is doing (see Relay.Health). A
// relay that stopped on an error it cannot recover from reports that
// error, as permanent.
func (g *Group) Health() map[string]Health {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Health, len(g.members))
	for name, m := range g.members {
		h := m.r.Health()
		if m.err != nil {
			h.Err, h.Permanent = m.err, true
		}
		out[name] = h
	}
	return out
}

// Stats returns each table's relay's running totals.
func (g *Group) Stats() map[string]Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Stats, len(g.members))
	for name, m := range g.members {
		out[name] = m.r.Stats()
	}
	return out
}

// Totals returns the running totals of every table's relay together,
// those of the tables removed included.
func (g *Group) Totals() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	total := g.gone
	for _, m := range g.members {
		total = total.plus(m.r.Stats())
	}
	return total
}

// plus returns the sums of s's and o's totals.
func (s Stats) plus(o Stats) Stats {
	return Stats{Batches: s.Batches + o.Batches, Published: s.Published + o.Published, Failed: s.Failed + o.Failed,
		Released: s.Released + o.Released, LeasesLost: s.LeasesLost + o.LeasesLost, Purged: s.Purged + o.Purged}
}

// Run relays every table of the group, and those added meanwhile, until
// ctx ends; each table's relay then shuts down as Relay.Run does, and Run
// returns nil when all have. A table whose relay stops on an error it
// cannot recover from (see Relay.Run: a table that is not an outbox
// table, an ordered table that cannot keep the order) is logged and left
// stopped, and Health reports it; the others go on. Run returns an error
// when it is already running, and, unless GroupConfig.KeepRunning, when
// every table's relay has stopped on an error.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.runCtx != nil {
		g.mu.Unlock()
		return errors.New("relay: Group.Run called while the group is already running")
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g.runCtx = runCtx
	// The tables' relays start spread over n / IdleClaims seconds (10ms
	// apart at the default), as fast as their idle claims would come: a
	// thousand relays starting at once would each look at the database
	// before the pool could serve them.
	gap := time.Duration(float64(time.Second) / g.idle)
	for k, name := range slices.Sorted(maps.Keys(g.members)) {
		m := g.members[name]
		m.err = nil
		g.start(m, time.Duration(k)*gap)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.runCtx = nil
		g.mu.Unlock()
	}()
	defer g.running.Wait()
	for {
		select {
		case <-runCtx.Done():
			return nil
		case <-g.stopped:
		}
		if err := g.allFailed(); err != nil && !g.keep {
			return err
		}
	}
}

// start runs m's relay under g.runCtx after delay (g.mu held).
func (g *Group) start(m *member, delay time.Duration) {
	ctx, stop := context.WithCancel(g.runCtx)
	m.stop, m.done = stop, make(chan struct{})
	g.running.Add(1)
	go func() {
		defer g.running.Done()
		defer stop()
		var err error
		if periodic.Sleep(ctx, delay) {
			err = m.r.Run(ctx)
		}
		g.mu.Lock()
		m.err = err
		close(m.done)
		g.mu.Unlock()
		select {
		case g.stopped <- struct{}{}:
		default:
		}
	}()
}

// allFailed returns the errors of the tables' relays when every one has
// stopped on an error, else nil.
func (g *Group) allFailed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(g.members)) {
		m := g.members[name]
		if m.err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", name, m.err))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("relay: every table of the group stopped on an error: %w", errors.Join(errs...))
}

// IdlePollInterval is the longest an idle table of the group waits between
// two claims now: Config.PollInterval, grown with the number of tables
// beyond IdleClaims × PollInterval (see GroupConfig.IdleClaims).
func (g *Group) IdlePollInterval() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cfg.PollInterval * time.Duration(g.factor())
}

// factor is what the group grows its idle relays' waits by (g.mu held).
func (g *Group) factor() int64 {
	perTable := float64(time.Second) / float64(g.cfg.PollInterval) // claims a second of an idle relay
	return int64(max(1, math.Ceil(float64(len(g.members))*perTable/g.idle)))
}

// rescale spreads the idle claims of IdleClaims over the group's tables
// (g.mu held): each relay's idle waits grow by the same factor.
func (g *Group) rescale() {
	f := g.factor()
	for _, m := range g.members {
		m.r.idleScale.Store(f)
	}
}
