package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/tcpproxy"
)

// verifyFaults are the faults outbox verify can inject, none of which
// needs administrator rights.
var verifyFaults = []string{"kill", "cut-db", "cut-broker", "stall"}

type verifyOptions struct {
	duration, faultEvery, lease, drainTimeout time.Duration
	rate                                      float64
	relays, keys, rollbackPct                 int
	faults                                    []string
	ordered, inbox, jsonOut, keep             bool
}

// verifyReport is what outbox verify found; --json prints it.
type verifyReport struct {
	Table           string         `json:"table"`
	Exchange        string         `json:"exchange"`
	Queue           string         `json:"queue"`
	Seconds         float64        `json:"seconds"`
	Ordered         bool           `json:"ordered"`
	Written         int            `json:"written"`
	RolledBack      int            `json:"rolled_back"`
	Committed       int            `json:"committed"`
	Deliveries      int            `json:"deliveries"`
	Lost            int            `json:"lost"`
	Phantom         int            `json:"phantom"`
	Duplicates      int            `json:"duplicates"`
	OrderViolations int            `json:"order_violations"`
	Inbox           *inboxReport   `json:"inbox,omitempty"`
	Faults          map[string]int `json:"faults"`
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
	c.fs.Float64Var(&o.rate, "rate", 200, "events written per second, one per transaction")
	c.fs.IntVar(&o.rollbackPct, "rollback-percent", 10, "percentage of the transactions rolled back on purpose: their events must never arrive")
	c.fs.IntVar(&o.relays, "relays", 2, "relays, each a process of this binary (outbox relay), restarted when killed")
	c.fs.IntVar(&o.keys, "keys", 50, "keys the events are spread over (per-key order is checked with --ordered)")
	faults := c.fs.String("faults", strings.Join(verifyFaults, ","), "faults to inject in turn, comma-separated: kill (SIGKILL a relay), cut-db and cut-broker (cut a relay's connections through a TCP proxy verify inserts), stall (SIGSTOP a relay past its lease); \"none\" for none")
	c.fs.DurationVar(&o.faultEvery, "fault-every", 3*time.Second, "time between faults")
	c.fs.DurationVar(&o.lease, "lease", 3*time.Second, "the relays' --lease; a stalled relay stays stopped a second longer")
	c.fs.DurationVar(&o.drainTimeout, "drain-timeout", time.Minute, "after writing, how long to wait for every committed event to arrive")
	c.fs.BoolVar(&o.ordered, "ordered", false, "ordered mode (outbox.OrderedByKey): also check that every key's first deliveries keep the order of writing")
	c.fs.BoolVar(&o.inbox, "inbox", false, "also consume through an inbox (package inbox) and check that every committed event had exactly one effect")
	c.fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON on stdout, for CI")
	c.fs.BoolVar(&o.keep, "keep", false, "keep the scratch table, exchange and queues to inspect them")
	if err := c.parse(args); err != nil {
		return err
	}
	if o.duration <= 0 || o.rate <= 0 || o.rate > maxRate || o.relays < 1 || o.keys < 1 || o.rollbackPct < 0 || o.rollbackPct > 90 || o.faultEvery <= 0 {
		return c.usageError("--duration, --rate (at most %d), --relays, --keys and --fault-every must be positive, --rollback-percent between 0 and 90", maxRate)
	}
	if o.lease < time.Second {
		return c.usageError("--lease must be at least 1s")
	}
	if *faults != "none" {
		for _, f := range strings.Split(*faults, ",") {
			if !slices.Contains(verifyFaults, f) {
				return c.usageError("unknown fault %q: %s or none", f, strings.Join(verifyFaults, ", "))
			}
			o.faults = append(o.faults, f)
		}
	}
	urls := c.amqpURLs(*amqpURL)
	if len(urls) == 0 {
		urls = []string{"amqp://guest:guest@localhost:5672/"}
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	v := &verifier{c: c, o: o, db: db, dbURL: c.databaseURL, amqpURL: urls[0], faults: map[string]int{}}
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
	table          string
	exchange       string
	queue          string
	dbProxy        *tcpproxy.Proxy
	amqpProxy      *tcpproxy.Proxy

	mu         sync.Mutex
	committed  map[string]time.Time // id: when its transaction committed
	rolledBack map[string]bool
	written    int
	arrived    map[string]time.Time // id: first delivery
	deliveries int
	firstByKey map[string][]string // key: ids in the order of their first deliveries
	faults     map[string]int
}

func (v *verifier) run(ctx context.Context) (*verifyReport, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	v.table, v.exchange, v.queue = "outbox_verify_"+sfx, "outbox.verify."+sfx, "outbox.verify."+sfx
	v.committed, v.rolledBack, v.arrived, v.firstByKey = map[string]time.Time{}, map[string]bool{}, map[string]time.Time{}, map[string][]string{}
	what := "removed at the end"
	if v.o.keep {
		what = "kept (--keep)"
	}
	fmt.Fprintf(v.c.stderr, "verify: scratch table %s, exchange and queue %s, %s\n", v.table, v.exchange, what)

	ordering := outbox.Unordered
	if v.o.ordered {
		ordering = outbox.OrderedByKey
	}
	store, err := outbox.NewStore(v.db, &outbox.StoreConfig{Table: v.table, Router: outbox.ToExchange(v.exchange), Ordering: ordering})
	if err != nil {
		return nil, err
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		return nil, v.c.explain(err)
	}
	if !v.o.keep {
		defer v.db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS "`+v.table+`", "`+v.table+`_inbox", "`+v.table+`_effects"`) //nolint:errcheck
	}
	conn, err := amqp.Dial(v.amqpURL)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %s", redactDSN(v.amqpURL), v.c.secrets.scrub(err.Error()))
	}
	defer conn.Close()
	if err := v.declare(conn); err != nil {
		return nil, err
	}
	if !v.o.keep {
		defer func() {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(v.queue, false, false, false)
				_, _ = ch.QueueDelete(v.queue+".inbox", false, false, false)
				_ = ch.ExchangeDelete(v.exchange, false, false)
			}
		}()
	}

	// The relays reach PostgreSQL and RabbitMQ through proxies of
	// verify's own, which cut their connections on cue.
	relayDB, relayAMQP, err := v.proxies()
	if err != nil {
		return nil, err
	}
	defer v.dbProxy.Close()   //nolint:errcheck
	defer v.amqpProxy.Close() //nolint:errcheck

	stopConsume, err := v.consume(ctx, conn)
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
	end := time.Now().Add(v.o.duration)
	done := make(chan error, 1)
	go func() { done <- v.write(ctx, store, end) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	nextFault := time.Now().Add(v.o.faultEvery)
	faultN := 0
	var writeErr error
writing:
	for {
		select {
		case writeErr = <-done:
			break writing
		case now := <-tick.C:
			if len(v.o.faults) > 0 && now.After(nextFault) {
				v.inject(ctx, relays, v.o.faults[faultN%len(v.o.faults)])
				faultN++
				nextFault = now.Add(v.o.faultEvery)
			}
			v.progress(start)
		}
	}
	if writeErr != nil {
		relays.stop()
		return nil, writeErr
	}
	// Every fault asked for happens at least once, however short the run.
	for _, f := range v.o.faults {
		v.mu.Lock()
		n := v.faults[f]
		v.mu.Unlock()
		if n == 0 {
			v.inject(ctx, relays, f)
		}
	}
	// Drain: every committed event must arrive (a stalled or killed relay's
	// batch comes back after its lease). What committed is what the table
	// holds, now that the writers are done: a commit whose answer the
	// writer missed (its context ended during COMMIT) may have gone through.
	final, err := v.tableIDs(ctx)
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
	return v.report(ctx, time.Since(start), effects)
}

func (v *verifier) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(v.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring exchange %s: %w", v.exchange, err)
	}
	queues := []string{v.queue}
	if v.o.inbox {
		queues = append(queues, v.queue+".inbox")
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, "#", v.exchange, false, nil); err != nil {
			return fmt.Errorf("binding queue %s: %w", q, err)
		}
	}
	return nil
}

// proxies starts the TCP proxies and returns the relays' URLs through them.
func (v *verifier) proxies() (dbURL, amqpURL string, err error) {
	pc, err := pgconn.ParseConfig(v.dbURL)
	if err != nil {
		return "", "", err
	}
	if strings.HasPrefix(pc.Host, "/") {
		return "", "", errors.New("the database URL names a Unix socket: verify's proxy needs a TCP host (host=…)")
	}
	if v.dbProxy, err = tcpproxy.New(net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))); err != nil {
		return "", "", err
	}
	port := v.dbProxy.Addr().Port
	if strings.Contains(v.dbURL, "://") {
		u, err := url.Parse(v.dbURL)
		if err != nil {
			return "", "", err
		}
		u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		dbURL = u.String()
	} else {
		dbURL = fmt.Sprintf("%s host=127.0.0.1 port=%d", v.dbURL, port) // later keywords win
	}
	uri, err := amqp.ParseURI(v.amqpURL)
	if err != nil {
		return "", "", err
	}
	if v.amqpProxy, err = tcpproxy.New(net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))); err != nil {
		return "", "", err
	}
	uri.Host, uri.Port = "127.0.0.1", v.amqpProxy.Addr().Port
	return dbURL, uri.String(), nil
}

// consume records every delivery of the queue: its first arrival, and per
// key the order of first deliveries.
func (v *verifier) consume(ctx context.Context, conn *amqp.Connection) (func(), error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(500, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(v.queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			now := time.Now()
			key, _ := d.Headers["x-event-key"].(string)
			v.mu.Lock()
			v.deliveries++
			if _, seen := v.arrived[d.MessageId]; !seen {
				v.arrived[d.MessageId] = now
				v.firstByKey[key] = append(v.firstByKey[key], d.MessageId)
			}
			v.mu.Unlock()
			_ = d.Ack(false)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { _ = ch.Close(); <-done }) }, nil
}

// consumeInbox consumes the second queue through an inbox whose effect is
// a row per message.
func (v *verifier) consumeInbox(ctx context.Context) (func(), error) {
	if _, err := v.db.ExecContext(ctx, `CREATE TABLE "`+v.table+`_effects" (message_id text NOT NULL)`); err != nil {
		return nil, err
	}
	ib, err := inbox.New(v.db, &inbox.Config{Consumer: "verify", Table: v.table + "_inbox", Logger: v.quiet()})
	if err != nil {
		return nil, err
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil {
		return nil, err
	}
	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+v.table+`_effects" VALUES ($1)`, d.MessageId)
		return err
	}
	c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: v.queue + ".inbox", Handler: effect, URLs: []string{v.amqpURL}, Logger: v.quiet()})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	return func() { cancel(); <-done }, nil
}

// quiet is a logger for verify's own consumer: errors only.
func (v *verifier) quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(v.c.stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// write commits one event per transaction at the configured rate, rolling
// back some on purpose, until end. The end is checked between
// transactions, never by cancelling one: a COMMIT cut short by a context
// may still land on the server after the writer gave up on it.
func (v *verifier) write(ctx context.Context, store *outbox.Store, end time.Time) error {
	interval := time.Duration(float64(time.Second) / v.o.rate)
	next := time.Now()
	for i := 0; time.Now().Before(end); i++ {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		next = next.Add(interval)
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		ids := id.String()
		rollback := mrand.IntN(100) < v.o.rollbackPct
		tx, err := v.db.BeginTx(ctx, nil)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		evt := outbox.Event{ID: ids, Type: "verify.event", Key: fmt.Sprint("key-", i%v.o.keys), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if err := store.Add(ctx, tx, evt); err != nil {
			_ = tx.Rollback()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		v.mu.Lock()
		v.written++
		v.mu.Unlock()
		if rollback {
			_ = tx.Rollback()
			v.mu.Lock()
			v.rolledBack[ids] = true
			v.mu.Unlock()
			continue
		}
		if err := tx.Commit(); err != nil {
			// Unknown whether it committed: the report reads the table.
			continue
		}
		now := time.Now()
		v.mu.Lock()
		v.committed[ids] = now
		v.mu.Unlock()
	}
	return nil
}

// tableIDs returns the ids of the events the table holds: the committed
// ones.
func (v *verifier) tableIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := v.db.QueryContext(ctx, `SELECT id::text FROM "`+v.table+`"`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids[id] = true
	}
	return ids, rows.Err()
}

func (v *verifier) allArrived(final map[string]bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for id := range final {
		if _, ok := v.arrived[id]; !ok {
			return false
		}
	}
	return true
}

func (v *verifier) progress(start time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var faults []string
	for _, f := range verifyFaults {
		if n := v.faults[f]; n > 0 {
			faults = append(faults, fmt.Sprintf("%s %d", f, n))
		}
	}
	fmt.Fprintf(v.c.stderr, "verify: %4.0fs  written %d (%d rolled back)  arrived %d of %d committed  deliveries %d  faults: %s\n",
		time.Since(start).Seconds(), v.written, len(v.rolledBack), len(v.arrived), len(v.committed), v.deliveries, orDefault(strings.Join(faults, ", "), "none yet"))
}

// awaitEffects waits until every committed event had its effect, or the
// deadline, and returns the effects per message id.
func (v *verifier) awaitEffects(ctx context.Context, final map[string]bool, deadline time.Time) (map[string]int, error) {
	for {
		effects := map[string]int{}
		rows, err := v.db.QueryContext(ctx, `SELECT message_id, count(*) FROM "`+v.table+`_effects" GROUP BY message_id`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				rows.Close()
				return nil, err
			}
			effects[id] = n
		}
		rows.Close()
		complete := true
		for id := range final {
			if effects[id] == 0 {
				complete = false
				break
			}
		}
		if complete || time.Now().After(deadline) || ctx.Err() != nil {
			return effects, rows.Err()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (v *verifier) report(ctx context.Context, took time.Duration, effects map[string]int) (*verifyReport, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	// The table is the truth about what committed: a commit whose answer
	// was lost (a cut connection) may have gone through.
	inTable := map[string]bool{}
	byKey := map[string][]string{}
	rows, err := v.db.QueryContext(ctx, `SELECT id::text, event_key FROM "`+v.table+`" ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return nil, err
		}
		inTable[id] = true
		byKey[key] = append(byKey[key], id)
	}
	rows.Close()
	rep := &verifyReport{Table: v.table, Exchange: v.exchange, Queue: v.queue, Seconds: math.Round(took.Seconds()*10) / 10, Ordered: v.o.ordered,
		Written: v.written, RolledBack: len(v.rolledBack), Committed: len(inTable), Deliveries: v.deliveries, Faults: v.faults}
	var lat []time.Duration
	for id := range inTable {
		a, ok := v.arrived[id]
		if !ok {
			rep.Lost++
			continue
		}
		if c, ok := v.committed[id]; ok {
			lat = append(lat, max(a.Sub(c), 0))
		}
	}
	for id := range v.arrived {
		if !inTable[id] {
			rep.Phantom++
		}
	}
	rep.Duplicates = v.deliveries - len(v.arrived)
	if v.o.ordered {
		for key, ids := range byKey {
			pos := make(map[string]int, len(ids))
			for i, id := range ids {
				pos[id] = i
			}
			last := -1
			for _, id := range v.firstByKey[key] {
				p, ok := pos[id]
				if !ok {
					continue
				}
				if p < last {
					rep.OrderViolations++
				}
				last = max(last, p)
			}
		}
	}
	if effects != nil {
		ir := &inboxReport{}
		for id, n := range effects {
			ir.Effects += n
			switch {
			case !inTable[id]:
				ir.Phantom++
			case n > 1:
				ir.AppliedMore++
			}
		}
		for id := range inTable {
			if effects[id] == 0 {
				ir.Missing++
			}
		}
		rep.Inbox = ir
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rep.LatencyMs = latencyReport{ms(percentile(lat, 0.5)), ms(percentile(lat, 0.9)), ms(percentile(lat, 0.99)), ms(lat[len(lat)-1])}
	}
	rep.OK = rep.Lost == 0 && rep.Phantom == 0 && rep.OrderViolations == 0 &&
		(rep.Inbox == nil || rep.Inbox.Missing == 0 && rep.Inbox.Phantom == 0 && rep.Inbox.AppliedMore == 0)
	return rep, nil
}

func (v *verifier) print(r *verifyReport) {
	w := v.c.stdout
	mode := "unordered"
	if r.Ordered {
		mode = "ordered by key"
	}
	fmt.Fprintf(w, "verify: %.0fs, %s; written %d, rolled back %d, committed %d; %d deliveries\n", r.Seconds, mode, r.Written, r.RolledBack, r.Committed, r.Deliveries)
	fmt.Fprintf(w, "  lost              %d\n  phantom           %d\n  duplicates        %d\n", r.Lost, r.Phantom, r.Duplicates)
	if r.Ordered {
		fmt.Fprintf(w, "  order violations  %d\n", r.OrderViolations)
	}
	if r.Inbox != nil {
		fmt.Fprintf(w, "  inbox: %d effects; missing %d, phantom %d, applied more than once %d\n", r.Inbox.Effects, r.Inbox.Missing, r.Inbox.Phantom, r.Inbox.AppliedMore)
	}
	var faults []string
	for _, f := range verifyFaults {
		faults = append(faults, fmt.Sprintf("%s %d", f, r.Faults[f]))
	}
	fmt.Fprintf(w, "  faults            %s\n", strings.Join(faults, ", "))
	fmt.Fprintf(w, "  commit → consume  p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	if r.OK {
		fmt.Fprintln(w, "verify: OK: nothing lost, nothing phantom"+map[bool]string{true: ", every key in order", false: ""}[r.Ordered])
	}
}

// inject applies one fault to a relay chosen at random.
func (v *verifier) inject(ctx context.Context, relays *relayGroup, fault string) {
	v.mu.Lock()
	v.faults[fault]++
	v.mu.Unlock()
	switch fault {
	case "kill":
		// Mid-batch, as far as can be told from outside: while the table
		// shows claimed messages not yet published (a relay holds them).
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			var n int
			err := v.db.QueryRowContext(ctx, `SELECT count(*) FROM "`+v.table+`" WHERE claim_token IS NOT NULL AND published_at IS NULL`).Scan(&n)
			if err != nil || n > 0 {
				break
			}
		}
		relays.signal(syscall.SIGKILL)
	case "cut-db":
		v.dbProxy.Cut()
	case "cut-broker":
		v.amqpProxy.Cut()
	case "stall":
		if p := relays.signal(syscall.SIGSTOP); p != nil {
			go func() {
				t := time.NewTimer(v.o.lease + time.Second)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
				}
				_ = p.Signal(syscall.SIGCONT)
			}()
		}
	}
}

// relayGroup runs relays as child processes and restarts those that die
// until stop.
type relayGroup struct {
	mu      sync.Mutex
	procs   []*os.Process
	stopped bool
	wg      sync.WaitGroup
}

func (v *verifier) startRelays(ctx context.Context, dbURL, amqpURL string) (*relayGroup, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"relay", "--table", v.table, "--lease", v.o.lease.String(), "--poll-interval", "50ms", "--shutdown-timeout", "2s"}
	if v.o.ordered {
		args = append(args, "--ordered")
	}
	g := &relayGroup{procs: make([]*os.Process, v.o.relays)}
	for i := range v.o.relays {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for {
				cmd := exec.Command(exe, args...)
				cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "AMQP_URL="+amqpURL)
				g.mu.Lock()
				if g.stopped {
					g.mu.Unlock()
					return
				}
				err := cmd.Start()
				if err == nil {
					g.procs[i] = cmd.Process
				}
				g.mu.Unlock()
				if err != nil {
					fmt.Fprintf(v.c.stderr, "verify: starting a relay: %v\n", err)
					return
				}
				_ = cmd.Wait()
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond): // a killed relay comes back, as a supervisor would bring it
				}
			}
		}()
	}
	return g, nil
}

// signal sends sig to a running relay chosen at random and returns it.
func (g *relayGroup) signal(sig os.Signal) *os.Process {
	g.mu.Lock()
	defer g.mu.Unlock()
	var live []*os.Process
	for _, p := range g.procs {
		if p != nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}
	p := live[mrand.IntN(len(live))]
	_ = p.Signal(sig)
	return p
}

// stop ends every relay with SIGTERM (after SIGCONT, for a stalled one)
// and waits.
func (g *relayGroup) stop() {
	g.mu.Lock()
	g.stopped = true
	for _, p := range g.procs {
		if p != nil {
			_ = p.Signal(syscall.SIGCONT)
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	g.mu.Unlock()
	g.wg.Wait()
}
