// Command benchtables measures one relay process over many outbox tables
// (relay.Group): whether a table with a backlog holds up the others. It
// creates --tables tables of its own (the default layout), runs two
// phases and drops them:
//
//   - quiet: every table but the first writes --rate events a second, one
//     a transaction, for --duration, and the relay publishes them;
//   - backlog: the same, after --backlog events were written to the first
//     table, which the relay works off meanwhile.
//
// Before them, a warm-up phase (--warmup, 60s; 0: none) writes and relays
// as the quiet one does, unmeasured: each database connection's first
// statements on a table build its caches of the table (a log table is
// about a hundred relations: partitions, their indexes, side tables),
// which costs a hundred writer connections across a hundred log tables
// the first minute or so (measured: the writers alone reached 292 events
// a second of 495 in their first 40 s, all of them after that).
//
// It prints each phase's commit → consume latency of the quiet tables'
// events (persistent messages to a durable queue, a consumer that acks),
// and how long the backlog took. Run it with DATABASE_URL and AMQP_URL set:
//
//	go run ./internal/benchtables --tables 100 --backlog 200000
package main

import (
	"cmp"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

func main() {
	tables := flag.Int("tables", 100, "outbox tables")
	backlog := flag.Int("backlog", 200_000, "events written to the first table before the second phase")
	rate := flag.Float64("rate", 5, "events a second each other table writes")
	duration := flag.Duration("duration", time.Minute, "how long each phase writes")
	warmup := flag.Duration("warmup", time.Minute, "how long the unmeasured warm-up phase writes (0: none)")
	rows := flag.Bool("rows", false, "tables of the rows layout (default: the log layout)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the quiet phase to this file")
	flag.Parse()
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	check(err)
	defer db.Close()
	db.SetMaxOpenConns(min(*tables+20, 60)) // the writers' own; the relay's pool is another
	db.SetMaxIdleConns(min(*tables+20, 60))
	rdb, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	check(err)
	defer rdb.Close()
	rdb.SetMaxOpenConns(12)
	rdb.SetMaxIdleConns(12)
	amqpURL := cmp.Or(os.Getenv("AMQP_URL"), relay.AMQPURLDefault)

	warnings := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tag := uuid.NewString()[:8]
	queue := "outbox.benchtables." + tag
	conn, err := amqp.Dial(amqpURL)
	check(err)
	defer conn.Close()
	ch, err := conn.Channel()
	check(err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	check(err)
	defer ch.QueueDelete(queue, false, false, false) //nolint:errcheck
	check(ch.Qos(2000, 0, false))
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	check(err)

	writers := make([]*outbox.Store, *tables)
	relays := make([]*outbox.Store, *tables)
	for i := range writers {
		name := fmt.Sprintf("benchtables_%s_%03d", tag, i)
		writers[i], err = outbox.NewStore(db, &outbox.StoreConfig{Table: name})
		check(err)
		create := writers[i].CreateLogSchemaIfAbsent
		if *rows {
			create = writers[i].CreateRowsSchemaIfAbsent
		}
		check(create(ctx))
		relays[i], err = outbox.NewStore(rdb, &outbox.StoreConfig{Table: name, Logger: slog.New(slog.DiscardHandler)})
		check(err)
		drop, err := outbox.DropSchema(name)
		check(err)
		defer db.Exec(drop) //nolint:errcheck
	}
	fmt.Printf("benchtables: %d tables (%s layout), the quiet ones %g events/s each, %s a phase; relay.Group in this process, defaults\n",
		*tables, layout(ctx, writers[0]), *rate, *duration)

	written := sync.Map{} // id → commit time
	var lat latencies
	var busyLeft atomic.Int64
	go func() {
		for d := range deliveries {
			now := time.Now()
			if t, ok := written.LoadAndDelete(d.MessageId); ok {
				lat.add(now.Sub(t.(time.Time)))
			} else {
				busyLeft.Add(-1)
			}
			_ = d.Ack(false)
		}
	}()

	type phase struct {
		name     string
		backlog  int
		duration time.Duration
	}
	phases := []phase{{"quiet", 0, *duration}, {"backlog", *backlog, *duration}}
	if *warmup > 0 {
		phases = append([]phase{{"warm-up (not a figure)", 0, *warmup}}, phases...)
	}
	for _, phase := range phases {
		if phase.backlog > 0 {
			start := time.Now()
			for n := 0; n < phase.backlog; n += 1000 {
				tx, err := db.BeginTx(ctx, nil)
				check(err)
				evts := make([]outbox.Event, min(1000, phase.backlog-n))
				for k := range evts {
					evts[k] = outbox.Event{Type: queue, Payload: []byte(`{}`)}
				}
				check(writers[0].Add(ctx, tx, evts...))
				check(tx.Commit())
			}
			busyLeft.Store(int64(phase.backlog))
			fmt.Printf("benchtables: %d events written to the first table in %s\n", phase.backlog, time.Since(start).Round(time.Millisecond))
		}
		lat.reset()
		pool0, cpu0 := rdb.Stats(), readCPU()
		pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqpURL, MaxConnections: 8, Logger: slog.New(slog.DiscardHandler)})
		check(err)
		var stages stageTimes
		g, err := relay.NewGroup(pub, &relay.GroupConfig{Config: relay.Config{Logger: warnings, Observer: &stages}})
		check(err)
		for _, s := range relays {
			check(g.Add(relay.Table{Name: s.Table(), Store: s}))
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- g.Run(rctx) }()
		for claimed := 0; claimed < len(relays); time.Sleep(10 * time.Millisecond) { // every table's relay running
			claimed = 0
			for _, h := range g.Health() {
				if !h.LastClaim.IsZero() {
					claimed++
				}
			}
		}
		start = time.Now()
		if *profile != "" && phase.name == "quiet" {
			f, err := os.Create(*profile)
			check(err)
			check(pprof.StartCPUProfile(f))
		}
		var drained atomic.Int64
		if phase.backlog > 0 {
			go func() {
				for busyLeft.Load() > 0 && rctx.Err() == nil {
					time.Sleep(10 * time.Millisecond)
				}
				if busyLeft.Load() <= 0 {
					drained.Store(int64(time.Since(start)))
				}
			}()
		}
		var wg sync.WaitGroup
		var writes, writeTime, beginTime atomic.Int64
		for _, s := range writers[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
				defer tick.Stop()
				for end := time.Now().Add(phase.duration); time.Now().Before(end); <-tick.C {
					t0 := time.Now()
					tx, err := db.BeginTx(ctx, nil)
					check(err)
					beginTime.Add(int64(time.Since(t0)))
					id := uuid.Must(uuid.NewV7()).String()
					check(s.Add(ctx, tx, outbox.Event{ID: id, Type: queue, Payload: []byte(`{}`)}))
					at := time.Now()
					written.Store(id, at) // before the commit: the relay may see it at once
					check(tx.Commit())
					writeTime.Add(int64(time.Since(at)))
					written.CompareAndSwap(id, at, time.Now())
					writes.Add(1)
				}
			}()
		}
		wg.Wait()
		if *profile != "" && phase.name == "quiet" {
			pprof.StopCPUProfile()
		}
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && (pendingQuiet(&written) > 0 || busyLeft.Load() > 0); {
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		check(<-done)
		check(pub.Close())
		p50, p99, max, n := lat.summary()
		fmt.Printf("benchtables: phase %s: the quiet tables' commit → consume p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d of %d events written)", phase.name, ms(p50), ms(p99), ms(max), n, writes.Load())
		if d := drained.Load(); d > 0 {
			fmt.Printf("; the backlog of %d published in %s", phase.backlog, time.Duration(d).Round(time.Millisecond))
		} else if left := busyLeft.Load(); phase.backlog > 0 && left > 0 {
			fmt.Printf("; %d of the backlog of %d not yet published when the relay stopped, %s after it started", left, phase.backlog, time.Since(start).Round(time.Second))
		}
		if w := writes.Load(); w > 0 {
			fmt.Printf(" [mean begin %.1f ms, add+commit %.1f ms]", ms(time.Duration(beginTime.Load()/w)), ms(time.Duration(writeTime.Load()/w)))
		}
		fmt.Println()
		pool := rdb.Stats()
		fmt.Printf("benchtables: phase %s: the relays' stages: %s; the relay's pool: %d waits for a connection, %s in all\n", phase.name, stages.summary(),
			pool.WaitCount-pool0.WaitCount, (pool.WaitDuration - pool0.WaitDuration).Round(time.Millisecond))
		cpu := readCPU()
		fmt.Printf("benchtables: phase %s: CPU over %s: this process %.1f s, the machine busy %.1f s of %.1f s\n", phase.name,
			cpu.at.Sub(cpu0.at).Round(100*time.Millisecond), (cpu.self - cpu0.self).Seconds(), (cpu.busy - cpu0.busy).Seconds(), (cpu.total - cpu0.total).Seconds())
	}
}

// cpuTimes are this process's CPU time and the machine's, busy and in all
// (from /proc/stat, in clock ticks of 10 ms).
type cpuTimes struct {
	at                time.Time
	self, busy, total time.Duration
}

func readCPU() cpuTimes {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	c := cpuTimes{at: time.Now(), self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	f := strings.Fields(strings.SplitN(string(stat), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq steal
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		d := time.Duration(n) * 10 * time.Millisecond
		if i < 8 {
			c.total += d
			if i != 3 && i != 4 {
				c.busy += d
			}
		}
	}
	return c
}

// stageTimes gathers how long the relays' claims and publishes took:
// where the time of a commit → consume goes. (The settles are not among
// them: Observer.Settled does not see the marks made as confirms come.)
type stageTimes struct {
	relay.NopObserver
	mu              sync.Mutex
	empty           int
	claims, publish latencies
	claimed         int
}

func (s *stageTimes) Claimed(_ context.Context, n int, d time.Duration, err error) {
	if err != nil {
		return
	}
	if n == 0 {
		s.mu.Lock()
		s.empty++
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.claimed += n
	s.mu.Unlock()
	s.claims.add(d)
}

func (s *stageTimes) Published(_ context.Context, _ int, d time.Duration) { s.publish.add(d) }

func (s *stageTimes) summary() string {
	s.mu.Lock()
	empty, claimed := s.empty, s.claimed
	s.mu.Unlock()
	c50, c99, _, n := s.claims.summary()
	p50, p99, _, _ := s.publish.summary()
	return fmt.Sprintf("%d claims that took %d messages (p50 %.1f ms, p99 %.1f ms), %d empty ones; publishes p50 %.1f ms, p99 %.1f ms",
		n, claimed, ms(c50), ms(c99), empty, ms(p50), ms(p99))
}

func pendingQuiet(m *sync.Map) (n int) {
	m.Range(func(any, any) bool { n++; return true })
	return n
}

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }
func (l *latencies) reset()              { l.mu.Lock(); l.d = nil; l.mu.Unlock() }

func (l *latencies) summary() (p50, p99, max time.Duration, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1], len(s)
}

func layout(ctx context.Context, s *outbox.Store) string {
	l, err := s.Layout(ctx)
	check(err)
	if l == outbox.LayoutLog {
		return "log"
	}
	return "rows"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
