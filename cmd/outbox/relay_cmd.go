package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	rtdebug "runtime/debug"
	"strings"
	"sync/atomic"
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
	c := newCommon("relay", x, outbox.TableDefault)
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	batch := c.fs.Int("batch-size", relay.BatchSizeDefault, "messages per claim")
	batchBytes := c.fs.Int64("batch-max-bytes", outbox.BatchMaxBytesDefault, "bytes of payloads and headers per claim (at least one message is always claimed): bounds the relay's memory, which the GC keeps under (max-in-flight + 1) times this, plus 32 MiB, unless GOMEMLIMIT is set (and lets grow to 5 times what is live below that, unless GOGC is set)")
	inFlight := c.fs.Int("max-in-flight", relay.MaxInFlightDefault, "batches claimed and not yet settled at once, each on a connection of its own")
	lease := c.fs.Duration("lease", relay.LeaseDefault, fmt.Sprintf("how long a claim holds, at least %s: a dead relay's batch waits this long for another relay, and a batch still unpublished after it may be published again by another relay", relay.LeaseMin))
	poll := c.fs.Duration("poll-interval", relay.PollIntervalDefault, fmt.Sprintf("sleep between polls when idle, at least %s", relay.PollIntervalMin))
	publishTimeout := c.fs.Duration("publish-timeout", 0, fmt.Sprintf("bound on publishing one batch, shorter than --lease (default %s, or a third of --lease if that is shorter)", relay.PublishTimeoutDefault))
	shutdown := c.fs.Duration("shutdown-timeout", relay.ShutdownTimeoutDefault, "how long to wait for confirms on SIGINT/SIGTERM before releasing")
	maxAttempts := c.fs.Int("max-attempts", outbox.MaxAttemptsDefault, "failed attempts after which a message is parked")
	purgeAfter := c.fs.Duration("purge-after", 0, "also purge published messages older than this, hourly (default: never)")
	notify := c.fs.Bool("notify", false, "wake on LISTEN/NOTIFY instead of waiting for the next poll; needs the table's trigger (outbox schema --notify --apply) and a direct connection, not a transaction pooler")
	name := c.fs.String("connection-name", relay.ConnectionNameDefault, "connection name shown in RabbitMQ's management UI")
	debug := c.fs.Bool("debug", false, "log every batch")
	ordered := c.fs.Bool("ordered", false, "expect an ordered table and refuse one that is not (outbox.OrderedByKey): the table keeps each key's order, whoever writes to it (outbox schema --ordered, outbox convert --to ordered), and a relay of an ordered table keeps it with or without this flag")
	listenURL := c.fs.String("listen-database-url", "", "with --notify: a direct PostgreSQL connection for LISTEN, when --database-url goes through a transaction pooler (default: --database-url)")
	topologyFile := c.fs.String("topology", "", "a topology file (see outbox declare) to declare on every connection before publishing")
	unroutable := c.fs.String("unroutable", "park", "what to do with a message no queue is bound for: park (an attempt, parked after --max-attempts; blocks its key in ordered mode), alternate (publish to --alternate-exchange) or drop (count and log it)")
	alternate := c.fs.String("alternate-exchange", "", "with --unroutable alternate: the exchange that receives unroutable messages")
	metricsAddr := c.fs.String("metrics-addr", "", "serve Prometheus metrics on /metrics, /healthz and /readyz at this address, e.g. 127.0.0.1:9464 (:9464 listens on every interface) (default: none)")
	if err := c.parse(args); err != nil {
		return err
	}
	urls := c.amqpURLs(*amqpURL)
	if err := c.positive(map[string]int64{
		"batch-size": int64(*batch), "batch-max-bytes": *batchBytes, "max-in-flight": int64(*inFlight), "lease": int64(*lease), "poll-interval": int64(*poll),
		"shutdown-timeout": int64(*shutdown), "max-attempts": int64(*maxAttempts),
	}); err != nil {
		return err
	}
	if *publishTimeout < 0 || *purgeAfter < 0 {
		return c.usageError("--publish-timeout and --purge-after must not be negative")
	}
	if *poll < relay.PollIntervalMin {
		return c.usageError("--poll-interval %s is too short: at least %s. An idle relay claims once per --poll-interval, each claim a database transaction, so a shorter one makes thousands a second that find nothing (use --notify to be woken at once instead)", *poll, relay.PollIntervalMin)
	}
	if *lease < relay.LeaseMin {
		return c.usageError("--lease %s is too short: at least %s. A batch still being published or marked when its lease runs out is taken and published again by another relay, so a lease shorter than a batch's round trips publishes messages many times", *lease, relay.LeaseMin)
	}
	if *publishTimeout >= *lease {
		return c.usageError("--publish-timeout (%s) must be shorter than --lease (%s), or another relay may take a batch while it is still being published", *publishTimeout, *lease)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		rtdebug.SetMemoryLimit(relayMemoryLimit(*batchBytes, *inFlight))
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
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	// Every line names the table: the logs of relays of several tables
	// must be told apart.
	logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level})).With(slog.String("table", c.table))
	// What the defaults above (or the environment) chose, for whoever
	// wonders what the relay holds itself to.
	logger.Info("relay: Runtime", slog.Int("gomaxprocs", runtime.GOMAXPROCS(0)), slog.Int64("memory_limit", rtdebug.SetMemoryLimit(-1)))

	db, store, err := c.open(ctx, &outbox.StoreConfig{MaxAttempts: *maxAttempts, BatchMaxBytes: *batchBytes, Logger: logger, Ordering: ordering(*ordered)})
	if err != nil {
		return err
	}
	defer db.Close()
	// The claimer, the settler and the work beside them (reconciling,
	// purging) each hold a connection at times; database/sql keeps only 2
	// idle ones by default, so a busy relay would open and close
	// connections (a PostgreSQL process each) all the time.
	db.SetMaxIdleConns(8)
	if err := probeTable(ctx, store, logger); err != nil {
		return c.explain(err)
	}
	if (*unroutable == "alternate") != (*alternate != "") {
		return c.usageError("--unroutable alternate and --alternate-exchange go together")
	}
	unr, err := relay.ParseUnroutable(*unroutable)
	if err != nil {
		return c.usageError("--unroutable %q: park, alternate or drop", *unroutable)
	}
	var topo *topology.Topology
	if *topologyFile != "" {
		f, err := os.Open(*topologyFile)
		if err != nil {
			return err
		}
		topo, err = topology.Parse(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("--topology %s: %w", *topologyFile, err)
		}
	}
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URLs: urls, ConnectionName: *name, Logger: logger,
		Unroutable: unr, AlternateExchange: *alternate, Topology: topo})
	if err != nil {
		return err
	}
	defer pub.Close()
	probeBroker(ctx, pub, logger)
	cfg := &relay.Config{
		BatchSize: *batch, MaxInFlight: *inFlight, Lease: *lease, PollInterval: *poll, PublishTimeout: *publishTimeout,
		ShutdownTimeout: *shutdown, PurgeAfter: *purgeAfter, Logger: logger,
	}
	if *notify && c.onMySQL() {
		return c.usageError("--notify: LISTEN/NOTIFY is PostgreSQL's; on MySQL and MariaDB the relay polls every --poll-interval")
	}
	if *notify {
		ok, err := store.HasNotifyTrigger(ctx)
		if err != nil {
			return c.explain(err)
		}
		if !ok {
			logger.Warn("relay: --notify, but the table has no NOTIFY trigger: nothing will wake the relay, it polls every --poll-interval; add it with `outbox schema --notify --apply`")
		}
		lurl := cmp.Or(*listenURL, c.databaseURL)
		c.secrets.addDSN(lurl)
		if cfg.Wakeup, err = pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: lurl, Table: c.table, Logger: logger}); err != nil {
			return err
		}
		if ok && !probeListen(ctx, db, c.table, cfg.Wakeup) {
			logger.Warn("relay: --notify, but a test notification did not arrive within 3s: LISTEN does not work through a transaction pooler (PgBouncer); give a direct connection with --listen-database-url. The relay polls every --poll-interval meanwhile")
		}
	}
	var running atomic.Pointer[relay.Relay] // read by the metrics server's goroutines
	if *metricsAddr != "" {
		// Ready: the last round went through, and the last claim is
		// recent (the idle relay claims every --poll-interval).
		within := max(10**poll, 10*time.Second)
		m, err := startMetrics(*metricsAddr, store, pub, c.cli, logger, func() relay.Health {
			if r := running.Load(); r != nil {
				return r.Health()
			}
			return relay.Health{}
		}, within)
		if err != nil {
			return err
		}
		defer m.close()
		cfg.Observer = m.obs
	}
	r, err := relay.New(store, pub, cfg)
	if err != nil {
		return c.usageError("%s", relayFlags.Replace(err.Error()))
	}
	running.Store(r)
	if err := r.Run(ctx); err != nil {
		return err
	}
	st := r.Stats()
	fmt.Fprintf(c.stdout, "relay stopped: %d published, %d failed, %d released, %d leases lost\n", st.Published, st.Failed, st.Released, st.LeasesLost)
	return nil
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
