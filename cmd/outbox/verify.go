package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/internal/tcpproxy"
)

// verifyFaults are the faults outbox verify injects by default, none of
// which needs administrator rights; verifyAdminFaults those it injects when
// asked, which need them: terminate-db ends the relays' database sessions
// with pg_terminate_backend (a superuser, or a member of
// pg_signal_backend; on MySQL and MariaDB with KILL CONNECTION of the
// sessions that come through verify's proxy, which needs CONNECTION_ADMIN
// or SUPER, or the relays' user), close-broker has RabbitMQ close the relays'
// connections (rabbitmqctl on this machine, or the command in
// OUTBOX_RABBITMQCTL), broker-outage stops RabbitMQ's application for
// --outage and starts it again (rabbitmqctl stop_app, start_app: every
// client of that broker loses its connections, not only the relays).
var (
	verifyFaults      = []string{"kill", "cut-db", "cut-broker", "stall"}
	verifyAdminFaults = []string{"terminate-db", "close-broker", "broker-outage"}
	verifyAllFaults   = slices.Concat(verifyFaults, verifyAdminFaults)
)

type verifyOptions struct {
	duration, faultEvery, lease, drainTimeout time.Duration
	publishTimeout, outage                    time.Duration
	rate                                      float64
	relays, keys, rollbackPct, writers        int
	batchSize                                 int
	relayLogs, dupsCSV                        string
	faults                                    []string
	ordered, inbox, jsonOut, keep, longTx     bool
	layout                                    string
}

// verifyReport is what outbox verify found; --json prints it.
type verifyReport struct {
	Table           string         `json:"table"`
	Exchange        string         `json:"exchange"`
	Queue           string         `json:"queue"`
	Seconds         float64        `json:"seconds"`
	Ordered         bool           `json:"ordered"`
	Layout          string         `json:"layout"`
	Written         int            `json:"written"`
	RolledBack      int            `json:"rolled_back"`
	Committed       int            `json:"committed"`
	Deliveries      int            `json:"deliveries"`
	Lost            int            `json:"lost"`
	Phantom         int            `json:"phantom"`
	Duplicates      int            `json:"duplicates"`
	DuplicatesBy    *dupReport     `json:"duplicates_by,omitempty"` // each duplicate put down to a fault, and when it came
	OrderViolations int            `json:"order_violations"`
	Inbox           *inboxReport   `json:"inbox,omitempty"`
	Faults          map[string]int `json:"faults"`
	FaultLog        []faultEvent   `json:"fault_log"` // each fault injected, with the messages in flight then
	LatencyMs       latencyReport  `json:"latency_ms"`
	OK              bool           `json:"ok"`
}

type inboxReport struct {
	Effects     int `json:"effects"`
	Missing     int `json:"missing"`
	Phantom     int `json:"phantom"`
	AppliedMore int `json:"applied_more_than_once"`
}

type latencyReport struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func cmdVerify(ctx context.Context, x *cli, args []string) error {
	c := newCommon("verify", x, "")
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	var o verifyOptions
	c.fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to write events while faults are injected")
	c.fs.Float64Var(&o.rate, "rate", 200, "events written per second, one per transaction, over all the writers")
	c.fs.IntVar(&o.writers, "writers", 1, "writers, each committing its share of --rate on a connection of its own")
	c.fs.IntVar(&o.rollbackPct, "rollback-percent", 10, "percentage of the transactions rolled back on purpose: their events must never arrive")
	c.fs.IntVar(&o.relays, "relays", 2, "relays, each a process of this binary (outbox relay), restarted when killed")
	c.fs.IntVar(&o.keys, "keys", 50, "keys the events are spread over (per-key order is checked with --ordered)")
	faults := c.fs.String("faults", strings.Join(verifyFaults, ","), "faults to inject in turn, comma-separated: kill (SIGKILL a relay, restarted at once), cut-db and cut-broker (cut a relay's connections through a TCP proxy verify inserts), stall (SIGSTOP a relay past its lease); with administrator rights, not by default: terminate-db (pg_terminate_backend of every relay session; KILL CONNECTION on MySQL and MariaDB), close-broker (RabbitMQ closes every relay connection, through rabbitmqctl), broker-outage (rabbitmqctl stop_app for --outage, then start_app: every client of the broker is cut off); \"none\" for none")
	c.fs.DurationVar(&o.faultEvery, "fault-every", 3*time.Second, "time between faults")
	c.fs.DurationVar(&o.lease, "lease", 3*time.Second, "the relays' --lease; a stalled relay stays stopped a second longer")
	c.fs.IntVar(&o.batchSize, "batch-size", 0, "the relays' --batch-size (0: the relay's default)")
	c.fs.DurationVar(&o.publishTimeout, "publish-timeout", 0, "the relays' --publish-timeout (0: the relay's default)")
	c.fs.DurationVar(&o.outage, "outage", 3*time.Second, "how long a broker-outage fault keeps RabbitMQ's application stopped")
	c.fs.StringVar(&o.dupsCSV, "duplicates-csv", "", "a file to write every duplicate delivery to (message id, first delivery, this one, redelivered by the broker, the fault it is put down to)")
	c.fs.StringVar(&o.relayLogs, "relay-logs", "", "a directory to write each relay's log to (relay-N.log, every batch: outbox relay --debug), to see what each did")
	c.fs.DurationVar(&o.drainTimeout, "drain-timeout", time.Minute, "after writing, how long to wait for every committed event to arrive")
	c.fs.BoolVar(&o.ordered, "ordered", false, "ordered mode (outbox.OrderedByKey): also check that every key's first deliveries keep the order of writing")
	c.fs.BoolVar(&o.longTx, "long-transaction", false, "also hold one writing transaction open for the whole --duration, committed last: its event must arrive (a cursor over ids or time would skip it)")
	c.fs.StringVar(&o.layout, "layout", "", "the scratch table's layout: log (the default, the one outbox schema creates) or rows; on MySQL and MariaDB, rows")
	c.fs.BoolVar(&o.inbox, "inbox", false, "also consume through an inbox (package inbox) and check that every committed event had exactly one effect")
	c.fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON on stdout, for CI")
	c.fs.BoolVar(&o.keep, "keep", false, "keep the scratch table, exchange and queues to inspect them")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := c.checkRate(o.rate, false); err != nil {
		return err
	}
	if o.duration <= 0 || o.relays < 1 || o.keys < 1 || o.writers < 1 || o.rollbackPct < 0 || o.rollbackPct > 90 || o.faultEvery <= 0 {
		return c.usageError("--duration, --relays, --writers, --keys and --fault-every must be positive, --rollback-percent between 0 and 90")
	}
	if o.batchSize < 0 || o.publishTimeout < 0 || o.outage <= 0 {
		return c.usageError("--batch-size and --publish-timeout must not be negative (0: the relay's default), --outage must be positive")
	}
	if o.publishTimeout >= o.lease {
		return c.usageError("--publish-timeout (%s) must be shorter than --lease (%s)", o.publishTimeout, o.lease)
	}
	mysql := c.onMySQL()
	switch {
	case mysql && o.layout == "log":
		return c.usageError("--layout log is PostgreSQL's; on MySQL and MariaDB a table has the rows layout")
	case o.layout == "" && mysql:
		o.layout = "rows"
	case o.layout == "":
		o.layout = "log"
	}
	if o.layout != "rows" && o.layout != "log" {
		return c.usageError("--layout must be rows or log (got %q)", o.layout)
	}

	if o.lease < time.Second {
		return c.usageError("--lease must be at least 1s")
	}
	if *faults != "none" {
		for _, f := range strings.Split(*faults, ",") {
			if !slices.Contains(verifyFaults, f) && !slices.Contains(verifyAdminFaults, f) {
				return c.usageError("unknown fault %q: %s or none", f, strings.Join(verifyAllFaults, ", "))
			}
			if f == "close-broker" || f == "broker-outage" {
				if _, err := rabbitmqctl(); err != nil {
					return c.usageError("--faults %s: %v", f, err)
				}
			}
			o.faults = append(o.faults, f)
		}
	}
	dialer, urls, err := c.amqpDialer(*amqpURL, "outbox-verify")
	if err != nil {
		return err
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	v := &verifier{c: c, o: o, db: db, dbURL: c.databaseURL, amqpURL: urls[0], dialer: dialer, faults: map[string]int{}, sql: verifySQL{mysql: mysql}}
	rep, err := v.run(ctx)
	if err != nil {
		return err
	}
	if o.jsonOut {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		v.print(rep)
	}
	if o.dupsCSV != "" {
		if err := v.writeDupsCSV(o.dupsCSV, rep.FaultLog); err != nil {
			return err
		}
	}
	if !rep.OK {
		return errors.New("the deployment did not keep the promise: see the report")
	}
	return nil
}

type verifier struct {
	c              *common
	o              verifyOptions
	db             *sql.DB
	dbURL, amqpURL string
	dialer         *amqpdial.Dialer // of amqpURL
	table          string
	exchange       string
	queue          string
	dbProxy        *tcpproxy.Proxy
	amqpProxy      *tcpproxy.Proxy
	store          *outbox.Store
	sql            verifySQL // verify's own statements, in the database's dialect

	mu         sync.Mutex
	committed  map[string]time.Time // id: when its transaction committed
	rolledBack int
	written    int
	arrived    map[string]time.Time // id: first delivery
	dups       []duplicate          // every delivery after a message's first
	deliveries int
	firstByKey map[string][]string // key: ids in the order of their first deliveries
	faults     map[string]int
	faultLog   []faultEvent
	started    time.Time // when writing began
}

func (v *verifier) run(ctx context.Context) (*verifyReport, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	v.table, v.exchange, v.queue = verifyTablePrefix+sfx, verifyAMQPPrefix+sfx, verifyAMQPPrefix+sfx
	v.committed, v.arrived, v.firstByKey = map[string]time.Time{}, map[string]time.Time{}, map[string][]string{}

	conn, err := v.c.dialFirst(ctx, v.dialer, v.amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// What killed runs left behind (the process cannot clean up after a
	// SIGKILL) goes before this run adds its own.
	removed, err := v.removeLeftovers(ctx, conn)
	if err != nil {
		return nil, err
	}
	if len(removed) > 0 {
		fmt.Fprintf(v.c.stderr, "verify: removed what %d earlier run(s) left behind, killed before they could: %s (tables, exchanges and queues)\n", len(removed), strings.Join(removed, ", "))
	}

	what := "removed at the end"
	if v.o.keep {
		what = "kept (--keep: later runs leave them alone; drop them by hand, the table " + v.table + "_alive included)"
	}
	fmt.Fprintf(v.c.stderr, "verify: scratch table %s, exchange and queue %s, %s\n", v.table, v.exchange, what)
	// The heartbeat first, the objects after it: a table without one is
	// a leftover for the runs after this one. Deferred calls run last in
	// first out: the tables go after the queues, the heartbeat last.
	stopBeat, err := v.startHeartbeat(ctx)
	if err != nil {
		return nil, err
	}
	if v.o.keep {
		defer v.keepForever(context.WithoutCancel(ctx))
	} else {
		defer v.dropRun(context.WithoutCancel(ctx), v.table) //nolint:errcheck
	}
	defer stopBeat()

	ordering := outbox.Unordered
	if v.o.ordered {
		ordering = outbox.OrderedByKey
	}
	store, err := outbox.NewStore(v.db, &outbox.StoreConfig{Table: v.table, Router: outbox.ToExchange(v.exchange), Ordering: ordering})
	if err != nil {
		return nil, err
	}
	create := store.CreateRowsSchemaIfAbsent
	switch {
	case v.sql.mysql: // one layout
		create = store.CreateSchemaIfAbsent
	case v.o.layout == "log":
		create = store.CreateLogSchemaIfAbsent
	}
	if err := create(ctx); err != nil {
		return nil, v.c.explain(err)
	}
	v.store = store
	if !v.o.keep {
		defer func() {
			// A broker-outage fault closed conn: clean up on a new one.
			c := conn
			if c.IsClosed() {
				var err error
				if c, err = v.c.dialFirst(context.WithoutCancel(ctx), v.dialer, v.amqpURL); err != nil {
					fmt.Fprintf(v.c.stderr, "verify: removing the exchange and queues %s: %v\n", v.queue, err)
					return
				}
				defer c.Close()
			}
			deleteRunAMQP(c, sfx)
		}()
	}
	if err := v.declare(ctx, conn); err != nil {
		return nil, err
	}

	// The relays reach PostgreSQL and RabbitMQ through proxies of
	// verify's own, which cut their connections on cue.
	relayDB, relayAMQP, err := v.proxies()
	if err != nil {
		return nil, err
	}
	defer v.dbProxy.Close()   //nolint:errcheck
	defer v.amqpProxy.Close() //nolint:errcheck

	stopConsume, err := v.consume(ctx)
	if err != nil {
		return nil, err
	}
	defer stopConsume()
	stopInbox := func() {}
	if v.o.inbox {
		if stopInbox, err = v.consumeInbox(ctx); err != nil {
			return nil, err
		}
	}

	relays, err := v.startRelays(ctx, relayDB, relayAMQP)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	v.started = start
	end := time.Now().Add(v.o.duration)
	done := make(chan error, 1)
	go func() { done <- v.write(ctx, store, end) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	faultTick := time.NewTicker(50 * time.Millisecond)
	defer faultTick.Stop()
	nextFault := time.Now().Add(v.o.faultEvery)
	faultN := 0
	var (
		writeErr error
		injected sync.WaitGroup
		began    = map[string]bool{}
	)
writing:
	for {
		select {
		case writeErr = <-done:
			break writing
		case now := <-faultTick.C:
			if len(v.o.faults) > 0 && now.After(nextFault) {
				f := v.o.faults[faultN%len(v.o.faults)]
				began[f] = true
				injected.Go(func() { v.inject(ctx, relays, f) })
				faultN++
				nextFault = nextFault.Add(v.o.faultEvery)
			}
		case <-tick.C:
			v.progress(start)
		}
	}
	if writeErr != nil {
		injected.Wait()
		relays.stop()
		return nil, writeErr
	}
	// Every fault asked for happens at least once, however short the run.
	for _, f := range v.o.faults {
		if !began[f] {
			began[f] = true
			injected.Go(func() { v.inject(ctx, relays, f) })
		}
	}
	injected.Wait()
	// Drain: every committed event must arrive (a stalled or killed relay's
	// batch comes back after its lease). What committed is what the table
	// holds, now that the writers are done: a commit whose answer the
	// writer missed (a cut connection) may have gone through.
	final, err := v.readTable(ctx)
	if err != nil {
		relays.stop()
		return nil, err
	}
	deadline := time.Now().Add(v.o.drainTimeout)
	for !v.allArrived(final) && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-tick.C:
			v.progress(start)
		case <-ctx.Done():
		}
	}
	relays.stop()
	var effects map[string]int
	if v.o.inbox {
		effects, err = v.awaitEffects(ctx, final, deadline)
		stopInbox()
		if err != nil {
			return nil, err
		}
	}
	stopConsume()
	return v.report(time.Since(start), final, effects), nil
}
