package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/pgpair"
)

// Issue 45: PostgreSQL fails over under load. A primary and its streaming
// standby of their own (package pgpair), GORM writers, two `outbox relay`
// processes and an inbox consumer, all through the pair's multi-host URL
// (target_session_attrs=read-write); then the primary goes away and the
// standby is promoted:
//
//   - crash: the primary is stopped at once (pg_ctl stop -m immediate),
//     then the standby promoted: with synchronous replication nothing
//     acknowledged is lost; with asynchronous, the tail its WAL had not
//     sent is (the standby's WAL receiver is stopped for a second before
//     the crash, as a standby that fell behind).
//   - fenced: the primary is made read-only first (what a failover
//     manager does to an old primary it can reach), its standby promoted
//     once it has replayed everything, and the old primary left running
//     read-only until the relays have moved: their sessions there fail
//     with SQLSTATE 25006 and must be dropped for the pool to find the new
//     primary.
//
// Checked per event, against what the new primary holds: no event whose
// business row survived is lost, ever; synchronous: no phantom (an event
// delivered whose transaction did not survive) and no acknowledged commit
// lost; asynchronous: phantoms and lost acknowledged commits are counted
// and named (they are asynchronous replication's). The inbox applies each
// message at most once, and (synchronous) every surviving one. Publishing
// resumes without a restart. Runs only with OUTBOX_FAILOVER_TEST=1;
// OUTBOX_FAILOVER_RUNS runs of each (default 1) for the medians.
func TestFailover(t *testing.T) {
	if os.Getenv("OUTBOX_FAILOVER_TEST") != "1" {
		t.Skip("set OUTBOX_FAILOVER_TEST=1 to run the failover harness (a PostgreSQL primary and standby of its own, minutes)")
	}
	runs := dbtest.EnvInt(t, "OUTBOX_FAILOVER_RUNS", 1)
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	modes := []struct {
		name string
		sync bool
		how  string
	}{{"sync", true, "crash"}, {"async", false, "crash"}, {"fenced", true, "fence"}}
	only := os.Getenv("OUTBOX_FAILOVER_MODES") // e.g. "sync/log,fenced/rows"
	for _, m := range modes {
		for _, layout := range []string{"log", "rows"} {
			name := m.name + "/" + layout
			if only != "" && !slices.Contains(strings.Split(only, ","), name) {
				continue
			}
			t.Run(name, func(t *testing.T) {
				var resumed, wresumed []time.Duration
				for i := 1; i <= runs; i++ {
					r := failoverRun(t, bin, m.sync, m.how, layout)
					t.Logf("failover %s run %d: %s", name, i, r)
					if len(r.phantom) > 0 { // named, as the contract says: asynchronous replication's phantoms
						t.Logf("failover %s run %d: phantoms, delivered but their transaction lost with the old primary: %s", name, i, strings.Join(r.phantom, " "))
					}
					resumed, wresumed = append(resumed, r.resumed), append(wresumed, r.writersResumed)
				}
				t.Logf("failover %s: publishing resumed %s after the promotion (median of %d runs; all: %v); writers %s (all: %v)",
					name, median(resumed), runs, resumed, median(wresumed), wresumed)
			})
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// failoverResult is what one run found.
type failoverResult struct {
	acked, surviving, delivered, deliveries int
	lost, phantom, ackedLost                []string // ids
	duplicates                              int
	effects, effectsTwice, effectsMissing   int
	resumed, writersResumed                 time.Duration
	readyz                                  []string // what the relays' /readyz said meanwhile
	advice, errorLines                      int      // relays' log lines with the read-only advice; at error level
}

func (r failoverResult) String() string {
	return fmt.Sprintf("%d commits acknowledged, %d events surviving, %d delivered (%d deliveries, %d duplicates); "+
		"lost %d, phantom %d %v, acknowledged but not surviving %d; inbox: %d effects, %d applied twice, %d surviving events without one; "+
		"writers resumed %s and publishing %s after the promotion; relays logged %d error lines, %d with the read-only advice; /readyz meanwhile: %s",
		r.acked, r.surviving, r.delivered, r.deliveries, r.duplicates, len(r.lost), len(r.phantom), short(r.phantom), len(r.ackedLost),
		r.effects, r.effectsTwice, r.effectsMissing, r.writersResumed.Round(10*time.Millisecond), r.resumed.Round(10*time.Millisecond),
		r.errorLines, r.advice, strings.Join(r.readyz, " | "))
}

func short(ids []string) []string {
	if len(ids) > 3 {
		return append(slices.Clone(ids[:3]), "…")
	}
	return ids
}

// foOrder is the writers' business row: its event has its id.
type foOrder struct {
	ID     string `gorm:"primaryKey;type:uuid"`
	Writer int
	outbox.Recorder
}

func (foOrder) TableName() string { return "fo_orders" }

func (o *foOrder) AfterCreate(*gorm.DB) error {
	evt, err := outbox.JSON("order.placed", "", map[string]any{"writer": o.Writer})
	evt.ID = o.ID
	o.Record(evt)
	return err
}

// foWorld is one run's writers and consumers, and what they saw.
type foWorld struct {
	mu         sync.Mutex
	began      map[string]time.Time // by event id: when its transaction began
	acked      map[string]time.Time // when its commit returned
	delivered  map[string]int       // deliveries of the raw queue
	firstAt    map[string]time.Time
	deliveries atomic.Int64
}

func failoverRun(t *testing.T, bin string, syncRep bool, how, layout string) failoverResult {
	p := pgpair.Start(t, syncRep)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const table = "fo_outbox"

	setup := p.A.DB()
	store, err := outbox.NewStore(setup, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	if layout == "rows" {
		require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	} else {
		require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	}
	ib, err := inbox.New(setup, &inbox.Config{Consumer: "fo"})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	_, err = setup.ExecContext(ctx, `CREATE TABLE fo_orders (id uuid PRIMARY KEY, writer int NOT NULL);
CREATE TABLE fo_effects (message_id uuid NOT NULL)`)
	require.NoError(t, err)

	exchange, rawQ, inboxQ := amqptest.Name(t, "fo.x"), amqptest.Name(t, "fo.raw"), amqptest.Name(t, "fo.inbox")
	conn := amqptest.Conn(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil))
	for _, q := range []string{rawQ, inboxQ, inboxQ + ".dead"} {
		args := amqp.Table{}
		if q == inboxQ {
			args = amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": inboxQ + ".dead"}
		}
		_, err := ch.QueueDeclare(q, true, false, false, false, args)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	}
	require.NoError(t, ch.QueueBind(rawQ, "#", exchange, false, nil))
	require.NoError(t, ch.QueueBind(inboxQ, "#", exchange, false, nil))
	t.Cleanup(func() { _ = ch.ExchangeDelete(exchange, false, false) })

	w := &foWorld{began: map[string]time.Time{}, acked: map[string]time.Time{}, delivered: map[string]int{}, firstAt: map[string]time.Time{}}
	w.consumeRaw(t, ctx, rawQ)

	// The inbox consumer, on the pair's URL like everything else.
	idb, err := sql.Open("pgx", p.URL())
	require.NoError(t, err)
	t.Cleanup(func() { idb.Close() })
	cib, err := inbox.New(idb, &inbox.Config{Consumer: "fo", Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	consumer, err := cib.Consumer(&inbox.ConsumerConfig{Queue: inboxQ, URLs: []string{amqptest.URL()}, BackoffMax: 2 * time.Second,
		Handler: func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO fo_effects VALUES ($1)`, d.MessageId)
			return err
		}})
	require.NoError(t, err)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- consumer.Run(cctx) }()
	defer func() { stopConsumer(); <-consumed }()

	relays := startFailoverRelays(t, bin, p.URL(), table, 2)
	readyz := relays.watch(ctx)

	// Writers: GORM, as an application writes. A pool keeps a connection
	// to a fenced node until the connection ends: ConnMaxLifetime bounds
	// that, as the failover contract recommends for applications.
	gdb, err := gorm.Open(postgres.New(postgres.Config{DSN: p.URL()}), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	require.NoError(t, err)
	sqlDB, err := gdb.DB()
	require.NoError(t, err)
	sqlDB.SetConnMaxLifetime(3 * time.Second)
	t.Cleanup(func() { sqlDB.Close() })
	require.NoError(t, gdb.Use(&gormoutbox.Plugin{Table: table, Router: outbox.ToExchange(exchange)}))
	wctx, stopWriters := context.WithCancel(ctx)
	var writers sync.WaitGroup
	for i := range 4 {
		writers.Add(1)
		go func() { defer writers.Done(); w.write(wctx, gdb, i) }()
	}

	// Under load for a while, then the failover.
	require.NoError(t, dbtest.Await(ctx, 30*time.Second, func() bool { return w.deliveries.Load() >= 2000 }), "the first 2,000 deliveries")
	var promoted time.Time
	switch how {
	case "crash":
		resume := func() {}
		if !syncRep {
			// An asynchronous standby that has fallen a second behind:
			// what the primary commits meanwhile dies with it.
			var err error
			resume, err = p.Lag(ctx, time.Second)
			require.NoError(t, err)
		}
		require.NoError(t, p.A.Crash())
		resume()
		promoted = time.Now()
		require.NoError(t, p.Promote(ctx))
	case "fence":
		require.NoError(t, p.A.Fence(ctx))
		require.NoError(t, p.AwaitReplay(ctx))
		promoted = time.Now()
		require.NoError(t, p.Promote(ctx))
		// The old primary stays up, read-only, until both relays claim
		// again and an event written on the new primary has arrived: the
		// relays left it by themselves.
		require.NoError(t, dbtest.Await(ctx, time.Minute, func() bool {
			return relays.allReady() && w.resumedAfter(promoted) > 0
		}), "the relays moved to the new primary while the old one still answered, read-only")
		require.NoError(t, p.A.Stop())
	}
	require.NoError(t, dbtest.Await(ctx, time.Minute, func() bool { return w.resumedAfter(promoted) > 0 }), "publishing resumed")
	// Load on the new primary: 300 of its events delivered (~3 s).
	require.NoError(t, dbtest.Await(ctx, time.Minute, func() bool { return w.deliveredAfter(promoted) >= 300 }), "300 events of the new primary delivered")
	stopWriters()
	writers.Wait()

	// Everything that survived arrives; the inbox handles every delivery.
	survivor := p.B.DB()
	surviving := map[string]bool{}
	require.NoError(t, dbtest.Await(ctx, 2*time.Minute, func() bool {
		ids, err := strings1(ctx, survivor, `SELECT id::text FROM fo_orders`)
		if err != nil {
			return false
		}
		clear(surviving)
		for _, id := range ids {
			surviving[id] = true
		}
		return w.allDelivered(surviving)
	}), "every surviving event delivered")
	require.NoError(t, dbtest.Await(ctx, time.Minute, func() bool {
		st := consumer.Stats()
		return st.Handled+st.Duplicates >= w.deliveries.Load()
	}), "the inbox handled every delivery")
	stopConsumer()
	<-consumed
	consumed <- nil
	relays.stop()

	r := w.result(surviving, promoted)
	r.readyz = readyz()
	r.advice, r.errorLines = relays.logCounts()
	effects := map[string]int{}
	rows, err := survivor.QueryContext(ctx, `SELECT message_id::text, count(*) FROM fo_effects GROUP BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		effects[id] = n
	}
	require.NoError(t, rows.Err())
	for _, n := range effects {
		r.effects++
		if n > 1 {
			r.effectsTwice++
		}
	}
	for id := range surviving {
		if effects[id] == 0 {
			r.effectsMissing++
		}
	}

	require.Empty(t, r.lost, "events whose business row survived, never delivered: %s", r)
	require.Zero(t, r.effectsTwice, "the inbox applied a message twice: %s", r)
	if syncRep {
		require.Empty(t, r.phantom, "synchronous replication: no phantom: %s", r)
		require.Empty(t, r.ackedLost, "synchronous replication: no acknowledged commit lost: %s", r)
		require.Zero(t, r.effectsMissing, "synchronous replication: every surviving event's effect applied: %s", r)
	}
	if how == "fence" {
		require.NotZero(t, r.advice, "the relays logged the read-only advice: %s", r)
	}
	return r
}

// consumeRaw counts every delivery of queue q by message id.
func (w *foWorld) consumeRaw(t *testing.T, ctx context.Context, q string) {
	conn := amqptest.Conn(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(500, 0, false))
	ds, err := ch.ConsumeWithContext(ctx, q, "", false, false, false, false, nil)
	require.NoError(t, err)
	go func() {
		for d := range ds {
			now := time.Now()
			w.mu.Lock()
			if w.delivered[d.MessageId] == 0 {
				w.firstAt[d.MessageId] = now
			}
			w.delivered[d.MessageId]++
			w.mu.Unlock()
			w.deliveries.Add(1)
			_ = d.Ack(false)
		}
	}()
}

// write places orders, one a transaction, until ctx ends, backing off
// after a failure as an application would.
func (w *foWorld) write(ctx context.Context, db *gorm.DB, writer int) {
	for ctx.Err() == nil {
		id := uuid.Must(uuid.NewV7()).String()
		began := time.Now()
		w.mu.Lock()
		w.began[id] = began
		w.mu.Unlock()
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return tx.Create(&foOrder{ID: id, Writer: writer}).Error
		})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		w.mu.Lock()
		w.acked[id] = time.Now()
		w.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// resumedAfter is how long after t the first event whose transaction
// began after t was delivered (0: none yet).
func (w *foWorld) resumedAfter(t time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for id, at := range w.firstAt {
		if w.began[id].After(t) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if first.IsZero() {
		return 0
	}
	return first.Sub(t)
}

// deliveredAfter counts the events delivered whose transaction began
// after t.
func (w *foWorld) deliveredAfter(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for id := range w.firstAt {
		if w.began[id].After(t) {
			n++
		}
	}
	return n
}

func (w *foWorld) allDelivered(surviving map[string]bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range surviving {
		if w.delivered[id] == 0 {
			return false
		}
	}
	return true
}

func (w *foWorld) result(surviving map[string]bool, promoted time.Time) failoverResult {
	r := failoverResult{resumed: w.resumedAfter(promoted), deliveries: int(w.deliveries.Load()), surviving: len(surviving)}
	w.mu.Lock()
	defer w.mu.Unlock()
	r.acked = len(w.acked)
	var firstAck time.Time
	for id, at := range w.acked {
		if !surviving[id] {
			r.ackedLost = append(r.ackedLost, id)
		}
		if w.began[id].After(promoted) && (firstAck.IsZero() || at.Before(firstAck)) {
			firstAck = at
		}
	}
	if !firstAck.IsZero() {
		r.writersResumed = firstAck.Sub(promoted)
	}
	for id, n := range w.delivered {
		r.delivered++
		r.duplicates += n - 1
		if !surviving[id] {
			r.phantom = append(r.phantom, id)
		}
	}
	for id := range surviving {
		if w.delivered[id] == 0 {
			r.lost = append(r.lost, id)
		}
	}
	slices.Sort(r.phantom)
	return r
}

func strings1(ctx context.Context, db *sql.DB, query string) ([]string, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// foRelays are `outbox relay` processes, each with its metrics server.
type foRelays struct {
	t     *testing.T
	procs []*exec.Cmd
	addrs []string
	logs  []string
	once  sync.Once
}

func startFailoverRelays(t *testing.T, bin, dbURL, table string, n int) *foRelays {
	g := &foRelays{t: t}
	for i := range n {
		addr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t))
		logPath := filepath.Join(t.TempDir(), fmt.Sprintf("relay%d.log", i+1))
		f, err := os.Create(logPath)
		require.NoError(t, err)
		cmd := exec.Command(bin, "relay", "--database-url", dbURL, "--amqp-url", amqptest.URL(), "--table", table, "--metrics-addr", addr)
		cmd.Stdout, cmd.Stderr = f, f
		require.NoError(t, cmd.Start())
		f.Close()
		g.procs, g.addrs, g.logs = append(g.procs, cmd), append(g.addrs, addr), append(g.logs, logPath)
	}
	t.Cleanup(g.stop)
	require.NoError(t, dbtest.Await(context.Background(), 30*time.Second, g.allReady), "the relays ready")
	return g
}

func (g *foRelays) ready(i int) (bool, string) {
	c := http.Client{Timeout: 7 * time.Second}
	resp, err := c.Get("http://" + g.addrs[i] + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
}

func (g *foRelays) allReady() bool {
	for i := range g.procs {
		if ok, _ := g.ready(i); !ok {
			return false
		}
	}
	return true
}

// watch polls every relay's /readyz every 250ms until ctx ends and returns
// a function that lists what they answered when not ready, each answer
// once, with how long after the first poll.
func (g *foRelays) watch(ctx context.Context) func() []string {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		out  []string
	)
	start := time.Now()
	for i := range g.procs {
		go func() {
			for ctx.Err() == nil {
				if ok, text := g.ready(i); !ok {
					// The advice, not the error's details, tells answers apart.
					key := fmt.Sprintf("relay %d: %.60s", i+1, text)
					mu.Lock()
					if !seen[key] {
						seen[key] = true
						out = append(out, fmt.Sprintf("%s (at %s)", key, time.Since(start).Round(100*time.Millisecond)))
					}
					mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-time.After(250 * time.Millisecond):
				}
			}
		}()
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

func (g *foRelays) stop() {
	g.once.Do(func() {
		for _, c := range g.procs {
			_ = c.Process.Signal(os.Interrupt)
		}
		for _, c := range g.procs {
			_ = c.Wait()
		}
	})
}

// logCounts counts the relays' log lines with the read-only advice, and
// those at error level, and shows the first 30 warnings and errors.
func (g *foRelays) logCounts() (advice, errors int) {
	shown := 0
	for _, path := range g.logs {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "point the database URL at the primary") {
				advice++
			}
			if strings.Contains(line, "level=ERROR") {
				errors++
			}
			if (strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN")) && shown < 30 {
				shown++
				g.t.Logf("%s: %s", filepath.Base(path), line)
			}
		}
		f.Close()
	}
	return advice, errors
}

func freeTCPPort(t *testing.T) int {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
