package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/relay"
)

// maxRate is the fastest --rate: a tick must be at least a microsecond.
const maxRate = 1_000_000

// benchOptions are the flags of outbox bench.
type benchOptions struct {
	messages, batch, inFlight, perTx, writers, size, prefetch, ackEvery, runs, keys int
	published, pending, blocked, delayed                                            int
	rate                                                                            float64
	notify, noWake, ordered, claims, relayProcess, holdSnapshot, floor              bool
	layout                                                                          string
	databaseURL                                                                     string // for --relay-process
}

// cmdBench measures what users of this database and broker get: a relay
// with its default configuration publishing persistent messages to a
// durable queue drained by a consumer that acks, beside the broker's own
// limit (amqp091-go publishing the same messages with pipelined confirms,
// no database) measured in the same run, before the relay's phase and
// again after it, and on as many connections as the relay publishes on.
// It drops what it created.
func cmdBench(ctx context.Context, x *cli, args []string) error {
	c := newCommon("bench", x, "") // bench makes a scratch table of its own
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	var o benchOptions
	c.fs.IntVar(&o.messages, "messages", 50_000, "messages per run")
	c.fs.IntVar(&o.batch, "batch-size", relay.BatchSizeDefault, "relay batch size")
	c.fs.IntVar(&o.inFlight, "max-in-flight", relay.MaxInFlightDefault, "relay batches in flight")
	c.fs.IntVar(&o.perTx, "per-tx", 100, "messages per writing transaction, when everything is written first (--rate 0)")
	c.fs.Float64Var(&o.rate, "rate", 0, "write this many messages per second, one per transaction, while the relay runs, and report commit-to-consume latency (default 0: write everything first and report throughput)")
	c.fs.IntVar(&o.writers, "writers", 1, "concurrent writers sharing --rate")
	c.fs.IntVar(&o.size, "size", 256, "payload bytes per message")
	c.fs.IntVar(&o.prefetch, "prefetch", 2000, "consumer prefetch")
	c.fs.IntVar(&o.ackEvery, "ack-every", 200, "the consumer acks every this many deliveries (multiple ack)")
	c.fs.BoolVar(&o.notify, "notify-after-commit", false, "writers call Store.Notify after each commit, as GORM's own transactions do (without it, Add's wake-up comes before the commit)")
	c.fs.BoolVar(&o.noWake, "no-wake", false, "the relay ignores the wake-ups of writers in its process, as a relay in another process would")
	c.fs.BoolVar(&o.holdSnapshot, "hold-snapshot", false, "hold a REPEATABLE READ snapshot open for the whole bench, as a long report query or a forgotten BEGIN does: VACUUM can then remove no dead row version younger than it")
	c.fs.IntVar(&o.delayed, "delayed", 0, "with --rate: also write this many delayed events (Event.NotBefore) as each run's relay starts, due over 59 s from 13 s later, spread evenly; report how long after its due time each was delivered, and the relay's claims a second before and after they were written")
	c.fs.BoolVar(&o.floor, "floor", true, "with --rate: before the relay's phase of each run, measure the floor under its figures on this machine: the same writers at the same rate publishing each message themselves right after its commit, with no relay")
	c.fs.BoolVar(&o.relayProcess, "relay-process", false, "run the relay as another process (outbox relay, this binary), as it runs in production: no in-process wake-ups, its own pool and GC")
	c.fs.IntVar(&o.runs, "runs", 3, "runs; each figure is their median, with min and max")
	c.fs.IntVar(&o.keys, "keys", 0, "spread the messages over this many keys, in turn (default 0: a key of its own for each message); with --rate 0 only")
	c.fs.BoolVar(&o.ordered, "ordered", false, "with --rate 0: measure the relay in ordered mode (outbox.OrderedByKey) too, in the same runs, and compare; with --rate: run the relay in ordered mode")
	c.fs.BoolVar(&o.claims, "claims", false, "measure claims alone, in both modes, on a table with --pending messages over --keys keys (default 10000), without and with --published rows of history; no broker")
	c.fs.IntVar(&o.published, "published", 1_000_000, "with --claims: published rows of history")
	c.fs.IntVar(&o.pending, "pending", 100_000, "with --claims: messages waiting")
	c.fs.IntVar(&o.blocked, "blocked", 0, "with --claims: also measure ordered claims with one key blocked by a parked message and this many of its messages written after it, before and after Store.Reconcile sets them aside")
	c.fs.StringVar(&o.layout, "layout", "", "the scratch table's layout: log (the default, the one outbox schema creates) or rows; with --claims, rows")
	cpuProfile := c.fs.String("cpuprofile", "", "write a CPU profile of the bench process (writers, relay and consumer) to this file")
	if err := c.parse(args); err != nil {
		return err
	}
	o.databaseURL = c.databaseURL
	dialer, urls, err := c.amqpDialer(*amqpURL, "")
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if err := c.positive(map[string]int64{
		"messages": int64(o.messages), "batch-size": int64(o.batch), "max-in-flight": int64(o.inFlight), "per-tx": int64(o.perTx), "writers": int64(o.writers),
		"size": int64(o.size), "prefetch": int64(o.prefetch), "ack-every": int64(o.ackEvery), "runs": int64(o.runs),
	}); err != nil {
		return err
	}
	if err := c.checkRate(o.rate, true); err != nil {
		return err
	}
	if o.claims {
		if err := c.positive(map[string]int64{"published": int64(o.published), "pending": int64(o.pending)}); err != nil {
			return err
		}
		if o.blocked < 0 {
			return c.usageError("--blocked must not be negative")
		}
	}
	if o.keys < 0 {
		return c.usageError("--keys must not be negative")
	}
	if o.delayed < 0 || (o.delayed > 0 && o.rate == 0) {
		return c.usageError("--delayed goes with --rate and must not be negative")
	}
	if o.keys > 0 && o.rate > 0 {
		return c.usageError("--keys goes with --rate 0 (the latency runs tell messages apart by their keys)")
	}
	mysql := c.onMySQL()
	switch {
	case mysql && o.claims:
		return c.usageError("--claims measures PostgreSQL's claim index; leave it out on MySQL and MariaDB")
	case mysql && o.layout == "log":
		return c.usageError("--layout log is PostgreSQL's; on MySQL and MariaDB a table has the rows layout")
	case o.layout == "" && (o.claims || mysql):
		o.layout = "rows"
	case o.layout == "":
		o.layout = "log"
	}
	if o.layout != "rows" && o.layout != "log" {
		return c.usageError("--layout must be rows or log (got %q)", o.layout)
	}
	if o.layout == "log" && o.claims {
		return c.usageError("--claims measures the claim index of the rows layout: leave out --layout log")
	}
	if o.ackEvery > o.prefetch {
		return c.usageError("--ack-every (%d) must not exceed --prefetch (%d), or the consumer stalls", o.ackEvery, o.prefetch)
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	c.table = "outbox_bench_" + suffix
	exchange, queue := "outbox.bench."+suffix, "outbox.bench."+suffix
	fmt.Fprintf(c.stderr, "bench: scratch table %s, exchange and queue %s, dropped at the end\n", c.table, exchange)

	db, store, err := c.open(ctx, &outbox.StoreConfig{Router: outbox.ToExchange(exchange)})
	if err != nil {
		return err
	}
	defer db.Close()
	// Writers, the relay and the consumer share this pool: keep their
	// connections (database/sql keeps 2 idle by default and closes the
	// rest, so that every burst opens new sessions, each loading the
	// catalog again), as outbox relay keeps 8 of its own.
	db.SetMaxIdleConns(max(16, 2*o.writers+o.inFlight+2))
	ordered, err := outbox.NewStore(db, &outbox.StoreConfig{Router: outbox.ToExchange(exchange), Table: c.table, Ordering: outbox.OrderedByKey})
	if err != nil {
		return err
	}
	create := store.CreateRowsSchemaIfAbsent
	if o.layout == "log" {
		create = store.CreateLogSchemaIfAbsent
	}
	if err := create(ctx); err != nil {
		return err
	}
	drop := dropScratch(c.table)
	if mysql {
		drop = "DROP TABLE IF EXISTS `" + c.table + "`, `" + c.table + "_keys`"
	}
	defer db.ExecContext(context.WithoutCancel(ctx), drop) //nolint:errcheck
	if o.claims {
		return claims(ctx, c, o, db)
	}
	if o.holdSnapshot {
		release, err := holdSnapshot(ctx, db, mysql)
		if err != nil {
			return err
		}
		defer release()
		fmt.Fprintln(c.stderr, "bench: holding a REPEATABLE READ snapshot open until the end (--hold-snapshot)")
	}

	// The bench's own publishing has a connection of its own, as the relay
	// has: RabbitMQ's flow control stops reading a connection that
	// publishes faster than its queue takes, and a consumer on that
	// connection then has its acks held back with the publishes. On a
	// machine where the broker was the bound, the broker alone made 7,413
	// msgs/s with one connection and 9,359 with two (BENCHMARKS.md).
	dial := func(name string) (*amqp.Connection, error) { return c.dialFirst(ctx, dialer.Named(name), urls[0]) }
	conn, err := dial("outbox-bench-consumer")
	if err != nil {
		return err
	}
	defer conn.Close()
	pubConn, err := dial("outbox-bench-publisher")
	if err != nil {
		return err
	}
	defer pubConn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// What users run: a durable exchange and queue, persistent messages.
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	defer func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	}()
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		return err
	}

	dbVersion, version := "PostgreSQL", "SHOW server_version"
	if mysql {
		dbVersion, version = "MySQL/MariaDB", "SELECT VERSION()"
	}
	var v string
	_ = db.QueryRowContext(ctx, version).Scan(&v)
	rmqVersion, _ := conn.Properties["version"].(string)
	fmt.Fprintf(c.stdout, "bench: %d cores, %s, %s %s, RabbitMQ %s; %s layout; %d-byte persistent messages, durable queue, consumer acking every %d (prefetch %d); relay defaults, batch %d, %d in flight; %d run(s), median [min–max]\n",
		runtime.NumCPU(), runtime.Version(), dbVersion, v, rmqVersion, o.layout, o.size, o.ackEvery, o.prefetch, o.batch, o.inFlight, o.runs)

	bench := &bencher{o: o, mysql: mysql, db: db, store: store, orderedStore: ordered, conn: conn, pubConn: pubConn, dialer: dialer, urls: urls, exchange: exchange, queue: queue, table: c.table,
		payload: []byte(`"` + strings.Repeat("x", max(o.size-2, 0)) + `"`), stderr: c.stderr}
	if o.rate == 0 {
		return bench.throughput(ctx, c.stdout)
	}
	if o.ordered {
		// The order is the table's: make it ordered.
		if _, err := ordered.ConvertOrdering(ctx, outbox.OrderedByKey, false, 5*time.Second); err != nil {
			return err
		}
		bench.store = ordered
	}
	return bench.latency(ctx, c.stdout)
}

type bencher struct {
	o               benchOptions
	mysql           bool // on MySQL or MariaDB
	db              *sql.DB
	store           *outbox.Store    // the writers' and the relay's
	orderedStore    *outbox.Store    // the same table in ordered mode
	conn            *amqp.Connection // the consumer's
	pubConn         *amqp.Connection // the publisher's, when the bench publishes (broker alone, the floor)
	dialer          *amqpdial.Dialer // of urls
	urls            []string
	exchange, queue string
	table           string
	payload         []byte
	stderr          io.Writer
	phases          *phaseObserver // of the last relay run
	deadBefore      int64          // the table's dead row versions before and after the last latency run
	deadAfter       int64
	walDuring       int64   // WAL flushes of the whole server during the last relay run of a throughput run, -1 if unknown
	relayPID        int     // the relay's process while it runs, with --relay-process
	cpu             cpuCost // where the CPU went in the last phase of a throughput run
}

// consume drains the queue with manual acks until want distinct message
// ids have arrived, calling seen for each new one. It returns when they
// have, or when ctx ends.
func (b *bencher) consume(ctx context.Context, want int, seen func(d *amqp.Delivery)) (func() error, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := ch.QueuePurge(b.queue, false); err != nil { // what an earlier phase left
		return nil, err
	}
	if err := ch.Qos(b.o.prefetch, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(b.queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		got := make(map[string]bool, want)
		unacked := 0
		for {
			select {
			case <-ctx.Done():
				done <- ctx.Err()
				return
			case d, ok := <-deliveries:
				if !ok {
					done <- fmt.Errorf("the consumer's channel closed")
					return
				}
				if !got[d.MessageId] {
					got[d.MessageId] = true
					seen(&d)
				}
				if unacked++; unacked == b.o.ackEvery || len(got) == want {
					if err := d.Ack(true); err != nil {
						done <- err
						return
					}
					unacked = 0
				}
				if len(got) == want {
					done <- nil
					return
				}
			}
		}
	}()
	return func() error {
		err := <-done
		_ = ch.Close()
		return err
	}, nil
}

// startRelay runs a relay with the default configuration (the batch size
// aside) until the returned function is called.
// startRelay starts a relay on st's table; onFail, when not nil, is called
// if the relay (in this process) stops on its own with an error.
func (b *bencher) startRelay(ctx context.Context, st *outbox.Store, onFail func(error)) (func() relay.Stats, error) {
	if b.o.relayProcess {
		return b.startRelayProcess(st)
	}
	logger := slog.New(slog.NewTextHandler(b.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URLs: b.urls, ConnectionName: "outbox-bench", Logger: logger})
	if err != nil {
		return nil, err
	}
	var store relay.Store = st
	if b.o.noWake {
		store = noWakeups{Store: st}
	}
	b.phases = &phaseObserver{}
	r, err := relay.New(store, pub, &relay.Config{Observer: b.phases, BatchSize: b.o.batch, MaxInFlight: b.o.inFlight, Logger: logger})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(rctx); err != nil && onFail != nil {
			onFail(err)
		}
		_ = pub.Close()
	}()
	return func() relay.Stats { cancel(); <-done; return r.Stats() }, nil
}

// key is the key of the bench's i-th message written first: one of --keys
// in turn, or a key of its own.
func (b *bencher) key(i int) string {
	if b.o.keys > 0 {
		return "k" + strconv.Itoa(i%b.o.keys)
	}
	return strconv.Itoa(i)
}

func (b *bencher) write(ctx context.Context, store *outbox.Store, keys []string) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	evts := make([]outbox.Event, len(keys))
	for i, k := range keys {
		evts[i] = outbox.Event{Type: "bench.tick", Key: k, Payload: b.payload}
	}
	if err := store.Add(ctx, tx, evts...); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if b.o.notify {
		store.Notify() // what GORM's own transactions do; Add alone wakes before the commit
	}
	return nil
}

// relayRun writes the messages, then relays them with store's mode and
// returns messages per second from the relay's start to the last delivery,
// and how many messages were first delivered after a later message of
// their key. The bench writes from one goroutine, so the ids (UUIDv7,
// monotonic in a process) follow the order of writing.
func (b *bencher) relayRun(ctx context.Context, store *outbox.Store) (float64, int, error) {
	if _, err := b.db.ExecContext(ctx, b.truncateSQL()); err != nil {
		return 0, 0, err
	}
	// The order is the table's: make it what this run measures.
	mode := outbox.Unordered
	if store == b.orderedStore {
		mode = outbox.OrderedByKey
	}
	if _, err := store.ConvertOrdering(ctx, mode, false, 5*time.Second); err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		failMu   sync.Mutex
		relayErr error
	)
	onFail := func(err error) {
		failMu.Lock()
		relayErr = err
		failMu.Unlock()
		cancel()
	}
	b.deadBefore = b.deadTuples(ctx) // PostgreSQL's count runs on across a TRUNCATE
	defer func() { b.deadAfter = b.deadTuples(ctx) }()
	for from := 0; from < b.o.messages; from += b.o.perTx {
		keys := make([]string, 0, b.o.perTx)
		for i := from; i < min(from+b.o.perTx, b.o.messages); i++ {
			keys = append(keys, b.key(i))
		}
		if err := b.write(ctx, store, keys); err != nil {
			return 0, 0, err
		}
	}
	last := make(map[string]string)
	late := 0
	wait, err := b.consume(ctx, b.o.messages, func(d *amqp.Delivery) {
		key, _ := d.Headers[relay.KeyHeader].(string)
		if d.MessageId < last[key] {
			late++
		} else {
			last[key] = d.MessageId
		}
	})
	if err != nil {
		return 0, 0, err
	}
	wal := b.walFlushes(ctx)
	cpu := readCPU(0)
	start := time.Now()
	stop, err := b.startRelay(ctx, store, onFail)
	if err != nil {
		return 0, 0, err
	}
	err = wait()
	elapsed := time.Since(start)
	b.cpu = readCPU(b.relayPID).sub(cpu).per(b.o.messages) // before the relay's process ends
	b.walDuring = -1
	if now := b.walFlushes(ctx); wal >= 0 && now >= 0 {
		b.walDuring = now - wal
	}
	st := stop()
	failMu.Lock()
	if relayErr != nil {
		err = fmt.Errorf("the relay stopped: %w", relayErr)
	}
	failMu.Unlock()
	if err != nil {
		return 0, 0, err
	}
	if st.Failed > 0 || st.Released > 0 {
		fmt.Fprintf(b.stderr, "bench: relay %d failed, %d released\n", st.Failed, st.Released)
	}
	return float64(b.o.messages) / elapsed.Seconds(), late, nil
}

// noWakeups is a store whose writes do not wake the relay, as a relay in
// another process would see it: its Subscribe offers none, and every other
// method of relay.Store is the store's.
type noWakeups struct {
	*outbox.Store
}

// Subscribe offers no wake-ups.
func (noWakeups) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }
