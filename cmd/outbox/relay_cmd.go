package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	rtdebug "runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/pgwake"
	"github.com/acemq/outbox/relay"
	"github.com/acemq/outbox/topology"
)

// amqpURLs returns the broker URLs of --amqp-url, else of AMQP_URL, and
// registers their passwords as secrets.
func (c *common) amqpURLs(flagValue string) []string {
	raw := flagValue
	if raw == "" {
		raw = c.getenv("AMQP_URL")
	}
	var urls []string
	for _, u := range strings.Split(raw, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	c.secrets.addDSN(urls...)
	return urls
}

const amqpURLHelp = "RabbitMQ URL(s), comma-separated for a cluster (default $AMQP_URL, else RabbitMQ on localhost:5672 as guest)"

func cmdRelay(ctx context.Context, x *cli, args []string) error {
	c := newCommon("relay", x, "")
	o := relayFlagSet(c)
	if err := c.parse(args); err != nil {
		return err
	}
	if len(o.tables) == 0 && o.pattern == "" {
		o.tables = tablesFlag{outbox.TableDefault}
	}
	for _, t := range o.tables {
		if looksLikeDSN(t) {
			return c.usageError("--table looks like a connection string (not shown: it may hold a password); --table takes a table name, the database goes in --database-url or DATABASE_URL")
		}
	}
	if err := o.check(c); err != nil {
		return err
	}
	return o.run(ctx, c)
}

// relayOptions are the flags of outbox relay.
type relayOptions struct {
	tables                                                                     tablesFlag
	pattern                                                                    string
	findEvery                                                                  time.Duration
	amqpURL, name, listenURL, topologyFile, unroutable, alternate, metricsAddr string
	batch, inFlight, maxConns, maxDBConns, maxAttempts                         int
	batchBytes                                                                 int64
	idleClaims                                                                 float64
	lease, poll, publishTimeout, shutdown, purgeAfter                          time.Duration
	notify, debug, ordered                                                     bool
	unr                                                                        relay.Unroutable // of unroutable, once checked
}

func relayFlagSet(c *common) *relayOptions {
	o := &relayOptions{}
	fs := c.fs
	fs.Var(&o.tables, "table", "the `table`, optionally schema-qualified (default "+outbox.TableDefault+"); give it once for each table to relay them all from one process")
	fs.StringVar(&o.pattern, "tables", "", "relay every outbox table whose name matches this `pattern` (* any characters, ? one), e.g. 'tenant_*.outbox', and those that come to match: the pattern is read again every --tables-every; a table dropped is let go")
	fs.DurationVar(&o.findEvery, "tables-every", 30*time.Second, "with --tables: how often to look for tables created or dropped")
	fs.StringVar(&o.amqpURL, "amqp-url", "", amqpURLHelp)
	fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "messages per claim")
	fs.Int64Var(&o.batchBytes, "batch-max-bytes", outbox.BatchMaxBytesDefault, "bytes of payloads and headers per claim (at least one message is always claimed): bounds the relay's memory, which the GC keeps under (max-in-flight + 1) times this, plus 32 MiB, unless GOMEMLIMIT is set (and lets grow to 5 times what is live below that, unless GOGC is set)")
	fs.IntVar(&o.inFlight, "max-in-flight", relay.MaxInFlightDefault, "batches claimed and not yet settled at once, each on a connection of its own (for each table)")
	fs.IntVar(&o.maxConns, "max-connections", 0, "the most broker connections the tables' publishes share (default: as many as publish at once with one table; twice --max-in-flight with several)")
	fs.IntVar(&o.maxDBConns, "max-db-connections", 0, "the most database connections the tables' relays share (default: as many as they use with one table; 4 + twice --max-in-flight with several)")
	fs.Float64Var(&o.idleClaims, "idle-claims", relay.IdleClaimsDefault, "with several tables: the most claims a second the idle tables make together; with more tables than this times --poll-interval, each idle table waits longer between claims (use --notify to be woken at once)")
	fs.DurationVar(&o.lease, "lease", relay.LeaseDefault, fmt.Sprintf("how long a claim holds, at least %s: a dead relay's batch waits this long for another relay, and a batch still unpublished after it may be published again by another relay", relay.LeaseMin))
	fs.DurationVar(&o.poll, "poll-interval", relay.PollIntervalDefault, fmt.Sprintf("sleep between polls when idle, at least %s", relay.PollIntervalMin))
	fs.DurationVar(&o.publishTimeout, "publish-timeout", 0, fmt.Sprintf("bound on publishing one batch, shorter than --lease (default %s, or a third of --lease if that is shorter)", relay.PublishTimeoutDefault))
	fs.DurationVar(&o.shutdown, "shutdown-timeout", relay.ShutdownTimeoutDefault, "how long to wait for confirms on SIGINT/SIGTERM before releasing")
	fs.IntVar(&o.maxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "failed attempts after which a message is parked")
	fs.DurationVar(&o.purgeAfter, "purge-after", 0, "also purge published messages older than this, hourly (default: never)")
	fs.BoolVar(&o.notify, "notify", false, "wake on LISTEN/NOTIFY instead of waiting for the next poll; needs the table's trigger (outbox schema --notify --apply) and a direct connection, not a transaction pooler")
	fs.StringVar(&o.name, "connection-name", relay.ConnectionNameDefault, "connection name shown in RabbitMQ's management UI")
	fs.BoolVar(&o.debug, "debug", false, "log every batch")
	fs.BoolVar(&o.ordered, "ordered", false, "expect an ordered table and refuse one that is not (outbox.OrderedByKey): the table keeps each key's order, whoever writes to it (outbox schema --ordered, outbox convert --to ordered), and a relay of an ordered table keeps it with or without this flag")
	fs.StringVar(&o.listenURL, "listen-database-url", "", "with --notify: a direct PostgreSQL connection for LISTEN, when --database-url goes through a transaction pooler (default: --database-url)")
	fs.StringVar(&o.topologyFile, "topology", "", "a topology file (see outbox declare) to declare on every connection before publishing")
	fs.StringVar(&o.unroutable, "unroutable", "park", "what to do with a message no queue is bound for: park (an attempt, parked after --max-attempts; blocks its key in ordered mode), alternate (publish to --alternate-exchange) or drop (count and log it)")
	fs.StringVar(&o.alternate, "alternate-exchange", "", "with --unroutable alternate: the exchange that receives unroutable messages")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on /metrics, /healthz and /readyz at this address, e.g. 127.0.0.1:9464 (:9464 listens on every interface) (default: none)")
	return o
}

// check refuses flags that do not go together, with advice.
func (o *relayOptions) check(c *common) error {
	if err := c.positive(map[string]int64{
		"batch-size": int64(o.batch), "batch-max-bytes": o.batchBytes, "max-in-flight": int64(o.inFlight), "lease": int64(o.lease), "poll-interval": int64(o.poll),
		"shutdown-timeout": int64(o.shutdown), "max-attempts": int64(o.maxAttempts),
	}); err != nil {
		return err
	}
	switch {
	case o.publishTimeout < 0 || o.purgeAfter < 0 || o.maxConns < 0 || o.maxDBConns < 0:
		return c.usageError("--publish-timeout, --purge-after, --max-connections and --max-db-connections must not be negative")
	case !(o.idleClaims > 0) || math.IsInf(o.idleClaims, 0):
		return c.usageError("--idle-claims must be positive")
	case o.poll < relay.PollIntervalMin:
		return c.usageError("--poll-interval %s is too short: at least %s. An idle relay claims once per --poll-interval, each claim a database transaction, so a shorter one makes thousands a second that find nothing (use --notify to be woken at once instead)", o.poll, relay.PollIntervalMin)
	case o.lease < relay.LeaseMin:
		return c.usageError("--lease %s is too short: at least %s. A batch still being published or marked when its lease runs out is taken and published again by another relay, so a lease shorter than a batch's round trips publishes messages many times", o.lease, relay.LeaseMin)
	case o.publishTimeout >= o.lease:
		return c.usageError("--publish-timeout (%s) must be shorter than --lease (%s), or another relay may take a batch while it is still being published", o.publishTimeout, o.lease)
	case o.notify && c.onMySQL():
		return c.usageError("--notify: LISTEN/NOTIFY is PostgreSQL's; on MySQL and MariaDB the relay polls every --poll-interval")
	case (o.unroutable == "alternate") != (o.alternate != ""):
		return c.usageError("--unroutable alternate and --alternate-exchange go together")
	}
	if o.pattern != "" {
		if looksLikeDSN(o.pattern) {
			return c.usageError("--tables looks like a connection string (not shown: it may hold a password); --tables takes a pattern of table names, the database goes in --database-url or DATABASE_URL")
		}
		if _, err := outbox.FindTables(context.Background(), nil, o.pattern); !errors.Is(err, outbox.ErrNoPool) {
			return c.usageError("--tables: %s", strings.TrimPrefix(err.Error(), "outbox: FindTables: "))
		}
		if o.findEvery < time.Second {
			return c.usageError("--tables-every %s is too short: at least 1s (each look reads the database's catalog)", o.findEvery)
		}
	}
	var err error
	if o.unr, err = relay.ParseUnroutable(o.unroutable); err != nil {
		return c.usageError("--unroutable %q: park, alternate or drop", o.unroutable)
	}
	return nil
}

// run relays the tables until ctx ends.
func (o *relayOptions) run(ctx context.Context, c *common) error {
	group := len(o.tables) > 1 || o.pattern != ""
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	// Every line of a table's relay names the table: the logs of relays
	// of several tables must be told apart.
	base := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level}))
	logger := base // the group's relays add their table's name
	if !group {
		logger = base.With(slog.String("table", o.tables[0]))
	}
	db, stores, err := c.openStores(ctx, o.tables, &outbox.StoreConfig{MaxAttempts: o.maxAttempts, BatchMaxBytes: o.batchBytes, Logger: logger, Ordering: ordering(o.ordered)})
	if err != nil {
		return err
	}
	defer db.Close()
	var found []string
	if o.pattern != "" {
		if found, err = outbox.FindTables(ctx, db, o.pattern); err != nil {
			return c.explain(err)
		}
		found = slices.DeleteFunc(found, func(t string) bool { return slices.Contains(o.tables, t) })
		if len(found)+len(o.tables) == 0 {
			base.Warn("relay: No table matches --tables yet; looking again every --tables-every", slog.String("pattern", o.pattern), slog.Duration("every", o.findEvery))
		}
	}
	setRelayRuntime(o.batchBytes, o.inFlight*max(1, len(o.tables)+len(found)))
	// What the defaults (or the environment) chose, for whoever wonders
	// what the relay holds itself to.
	logger.Info("relay: Runtime", slog.Int("gomaxprocs", runtime.GOMAXPROCS(0)), slog.Int64("memory_limit", rtdebug.SetMemoryLimit(-1)))
	// The claimer, the settler and the work beside them (reconciling,
	// purging) each hold a connection at times; database/sql keeps only 2
	// idle ones by default, so a busy relay would open and close
	// connections (a PostgreSQL process each) all the time.
	db.SetMaxIdleConns(8)
	// The relays of several tables share the pool: bounded, so that a
	// thousand tables do not open a thousand connections (a claim, a
	// settle or a look holds one for a statement or a short transaction).
	if n := cmp.Or(o.maxDBConns, 4+2*o.inFlight); group || o.maxDBConns > 0 {
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
	}
	for _, st := range stores {
		if err := probeTable(ctx, st, base.With(slog.String("table", st.Table()))); err != nil {
			if group {
				err = fmt.Errorf("%s: %w", st.Table(), err)
			}
			return c.explain(err)
		}
	}
	pub, err := o.publisher(logger, group, c.amqpURLs(o.amqpURL))
	if err != nil {
		return err
	}
	defer pub.Close()
	probeBroker(ctx, pub, logger)
	g, err := relay.NewGroup(pub, &relay.GroupConfig{IdleClaims: o.idleClaims, KeepRunning: o.pattern != "", Config: relay.Config{
		BatchSize: o.batch, MaxInFlight: o.inFlight, Lease: o.lease, PollInterval: o.poll, PublishTimeout: o.publishTimeout,
		ShutdownTimeout: o.shutdown, PurgeAfter: o.purgeAfter, Logger: base,
	}})
	if err != nil {
		return c.usageError("%s", relayFlags.Replace(err.Error()))
	}
	ts := &relayTables{c: c, o: o, db: db, g: g, base: base, cfg: outbox.StoreConfig{MaxAttempts: o.maxAttempts, BatchMaxBytes: o.batchBytes, Logger: base, Ordering: ordering(o.ordered)},
		listeners: map[string]func(){}, found: map[string]bool{}, lookNow: make(chan struct{}, 1)}
	defer ts.close()
	if o.metricsAddr != "" {
		// Ready: the last round of every table went through, and its last
		// claim is recent (an idle relay claims every --poll-interval, a
		// group's idle tables less often, and the group says how often).
		within := func() time.Duration { return max(10*g.IdlePollInterval(), 10*time.Second) }
		if ts.metrics, err = startMetrics(o.metricsAddr, pub, c.cli, logger, group, g.Health, within); err != nil {
			return err
		}
		defer ts.metrics.close()
	}
	for _, st := range stores {
		if err := ts.add(ctx, st, false); err != nil {
			return err
		}
	}
	for _, name := range found {
		ts.addFound(ctx, name)
	}
	if o.pattern != "" {
		go ts.watch(ctx)
	}
	if err := g.Run(ctx); err != nil {
		return err
	}
	total := g.Totals()
	fmt.Fprintf(c.stdout, "relay stopped: %d published, %d failed, %d released, %d leases lost\n", total.Published, total.Failed, total.Released, total.LeasesLost)
	return nil
}

// publisher makes the publisher every table's relay shares.
func (o *relayOptions) publisher(logger *slog.Logger, group bool, urls []string) (*relay.AMQPPublisher, error) {
	var topo *topology.Topology
	if o.topologyFile != "" {
		f, err := os.Open(o.topologyFile)
		if err != nil {
			return nil, err
		}
		topo, err = topology.Parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--topology %s: %w", o.topologyFile, err)
		}
	}
	conns := o.maxConns
	if conns == 0 && group {
		conns = 2 * o.inFlight
	}
	return relay.NewAMQPPublisher(&relay.AMQPConfig{URLs: urls, ConnectionName: o.name, Logger: logger,
		Unroutable: o.unr, AlternateExchange: o.alternate, Topology: topo, MaxConnections: conns})
}

// tablesFlag is --table of outbox relay, which may be given once for each
// table.
type tablesFlag []string

func (f *tablesFlag) String() string { return strings.Join(*f, ",") }

func (f *tablesFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("--table is empty; give a table's name or leave the flag out")
	}
	if slices.Contains(*f, v) {
		return errors.New("a table given twice")
	}
	*f = append(*f, v)
	return nil
}

// setRelayRuntime sets the memory limit, the GC's target and GOMAXPROCS
// of `outbox relay`, each unless the environment does; inFlight is the
// batches of every table together.
func setRelayRuntime(batchBytes int64, inFlight int) {
	if os.Getenv("GOMEMLIMIT") == "" {
		rtdebug.SetMemoryLimit(relayMemoryLimit(batchBytes, inFlight))
	}
	if os.Getenv("GOGC") == "" {
		// The relay allocates for every message (the rows it reads, the
		// frames it writes) and keeps little, so with Go's default the GC
		// runs whenever a few MB were allocated: a quarter of the relay's
		// CPU at 15,000 messages/s (BENCHMARKS.md). The memory limit
		// above still bounds the heap when batches are large.
		rtdebug.SetGCPercent(relayGOGC)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(relayGOMAXPROCS)
	}
}

// openStores connects to the database and opens a store for each table
// on that one pool; a bad table name fails before any connection.
func (c *common) openStores(ctx context.Context, tables []string, cfg *outbox.StoreConfig) (*sql.DB, []*outbox.Store, error) {
	for _, t := range tables {
		tc := *cfg
		tc.Table = t
		if _, err := outbox.NewStore(nil, &tc); err != nil {
			return nil, nil, err
		}
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	stores := make([]*outbox.Store, len(tables))
	for i, t := range tables {
		tc := *cfg
		tc.Table = t
		if len(tables) > 1 {
			tc.Logger = cfg.Logger.With(slog.String("table", t))
		}
		if stores[i], err = outbox.NewStore(db, &tc); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	return db, stores, nil
}

// listen subscribes to the LISTEN/NOTIFY wake-ups of st's table
// (--notify) on the one listening connection of every table (made with the
// first, to --listen-database-url or --database-url), and warns when they
// cannot work: a table without the trigger, or a test notification that
// does not arrive (sent on the first table that has the trigger: every
// table's come through the same connection).
func (ts *relayTables) listen(ctx context.Context, st *outbox.Store) (<-chan struct{}, func(), error) {
	logger := ts.base.With(slog.String("table", st.Table()))
	ok, err := st.HasNotifyTrigger(ctx)
	if err != nil {
		return nil, nil, ts.c.explain(err)
	}
	if !ok {
		logger.Warn("relay: --notify, but the table has no NOTIFY trigger: nothing will wake the relay, it polls every --poll-interval; add it with `outbox schema --notify --apply`")
	}
	if ts.listener == nil {
		url := cmp.Or(ts.o.listenURL, ts.c.databaseURL)
		ts.c.secrets.addDSN(url)
		if ts.listener, err = pgwake.NewListener(ctx, &pgwake.ListenerConfig{DatabaseURL: url, Logger: ts.base}); err != nil {
			return nil, nil, err
		}
	}
	wake, stop, err := ts.listener.Subscribe(ctx, st.Table())
	if err != nil {
		return nil, nil, err
	}
	if ok && !ts.listened {
		ts.listened = true
		if !probeListen(ctx, ts.db, st.Table(), wake) {
			logger.Warn("relay: --notify, but a test notification did not arrive within 3s: LISTEN does not work through a transaction pooler (PgBouncer); give a direct connection with --listen-database-url. The relay polls every --poll-interval meanwhile")
		}
	}
	return wake, stop, nil
}

// relayMemoryLimit is the soft limit of `outbox relay`'s heap unless
// GOMEMLIMIT is set: what its batches may hold at once, so that the GC
// keeps near it rather than let the heap grow to GOGC's target. The
// claimer claims only while fewer than inFlight batches are unsettled, so
// at most inFlight-1 batches are being published (each holds its
// messages, up to batchBytes of payloads and headers) while the next is
// claimed, which is in memory about twice (the driver's read buffer and
// the scanned rows); 32 MiB more are the rest of the process. A limit
// below what is live makes the GC run back to back.
func relayMemoryLimit(batchBytes int64, inFlight int) int64 {
	return int64(inFlight+1)*batchBytes + 32<<20
}

// relayGOGC is the GC's target for `outbox relay` unless GOGC is set: the
// heap may grow to 5 times what is live before the GC runs (Go's default,
// 100, is twice).
const relayGOGC = 400

// relayGOMAXPROCS is how many threads `outbox relay` runs Go code on
// unless GOMAXPROCS is set. The relay waits on the database and the broker
// and uses a fraction of a core (on a thread per core, 0.16 of one at 2,000
// messages/s and 0.22 at 12,000); with a thread per core, Go's scheduler
// spins idle threads looking for work every time a goroutine wakes, which
// on a small machine shared with PostgreSQL and RabbitMQ is CPU they need.
// On one thread the relay's process used a fifth less CPU at 2,000/s and
// a seventh less at full speed, publishing as fast (BENCHMARKS.md, an
// eighth session).
const relayGOMAXPROCS = 1

// probeTable checks at start that the table is there and ours (Gauges is
// cheap however large the table). An error that waiting can cure (a
// terminated session, a database restarting) is retried with backoff, as
// the relay's loop would; one that needs a person (a missing table, a
// refused password, a table that is not an outbox table) is returned.
func probeTable(ctx context.Context, store *outbox.Store, logger *slog.Logger) error {
	backoff := outbox.ExponentialBackoff(100*time.Millisecond, 5*time.Second)
	for attempt := 1; ; attempt++ {
		_, err := store.Gauges(ctx, 1)
		if err == nil || relay.Advice(err) != "" || errors.Is(err, outbox.ErrInvalidTable) || ctx.Err() != nil {
			return err
		}
		wait := backoff(attempt)
		logger.WarnContext(ctx, "relay: Checking the table failed; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// probeListen sends a notification on the table's channel through db and
// reports whether the listener behind wake received it within 3s. Through
// a transaction pooler LISTEN seems to work but receives nothing.
func probeListen(ctx context.Context, db *sql.DB, table string, wake <-chan struct{}) bool {
	channel, err := outbox.NotifyChannel(table)
	if err != nil {
		return false
	}
	select { // a wake-up already pending proves nothing
	case <-wake:
	default:
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_notify($1, 'probe')`, channel); err != nil {
		return false
	}
	select {
	case <-wake:
		return true
	case <-time.After(3 * time.Second):
		return false
	case <-ctx.Done():
		return true // shutting down: nothing to warn about
	}
}

// probeBroker connects to the broker at start, so that a refused login is
// logged at once, as permanent and with its advice, rather than when the
// first message comes. The relay runs either way: it retries, and an
// operator may fix the broker meanwhile.
func probeBroker(ctx context.Context, pub *relay.AMQPPublisher, logger *slog.Logger) {
	cctx, cancel := context.WithTimeout(ctx, relay.DialTimeoutDefault)
	defer cancel()
	err := pub.Check(cctx)
	switch advice := relay.Advice(err); {
	case err == nil:
	case advice != "":
		logger.ErrorContext(ctx, "relay: The broker refused the relay: failing permanently until this is fixed", slog.String("error", err.Error()),
			slog.String("advice", advice))
	default:
		logger.WarnContext(ctx, "relay: The broker does not answer yet; the relay retries", slog.String("error", err.Error()))
	}
}

// relayFlags names the flags behind relay.Config's fields in its errors.
var relayFlags = strings.NewReplacer("relay: ", "", "Config.BatchSize", "--batch-size", "Config.MaxInFlight", "--max-in-flight",
	"Config.Lease", "--lease", "Config.PollInterval", "--poll-interval", "Config.PublishTimeout", "--publish-timeout",
	"Config.PurgeAfter", "--purge-after", "Config.ShutdownTimeout", "--shutdown-timeout")

// ordering turns the --ordered flag into a store's Ordering.
func ordering(ordered bool) outbox.Ordering {
	if ordered {
		return outbox.OrderedByKey
	}
	return outbox.Unordered
}
