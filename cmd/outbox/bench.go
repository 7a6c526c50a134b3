package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// maxRate is the fastest --rate: a tick must be at least a microsecond.
const maxRate = 1_000_000

// cmdBench measures this database and broker: it writes messages into a
// scratch table, relays them to a scratch exchange and reports throughput
// and commit-to-consume latency. It drops what it created.
func cmdBench(ctx context.Context, x *cli, args []string) error {
	stdout, stderr := x.stdout, x.stderr
	c := newCommon("bench", x, false)
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	n := c.fs.Int("messages", 50_000, "messages to relay")
	rate := c.fs.Int("rate", 0, "write this many messages per second while the relay runs (0: write all first, then measure throughput)")
	batch := c.fs.Int("batch-size", 500, "relay batch size")
	perTx := c.fs.Int("per-tx", 100, "messages per writing transaction (with --rate 0)")
	if err := c.parse(args); err != nil {
		return err
	}
	urls := c.amqpURLs(*amqpURL)
	if err := c.positive(map[string]int64{"messages": int64(*n), "batch-size": int64(*batch), "per-tx": int64(*perTx)}); err != nil {
		return err
	}
	if *rate < 0 || *rate > maxRate {
		return c.usageError("--rate must be between 0 and %d messages per second", maxRate)
	}
	if len(urls) == 0 {
		urls = []string{relay.AMQPURLDefault}
	}
	if _, err := amqp.ParseURI(urls[0]); err != nil {
		return fmt.Errorf("the AMQP URL %s is not valid: %s", redactDSN(urls[0]), x.secrets.scrub(err.Error()))
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	c.table = "outbox_bench_" + suffix
	fmt.Fprintf(stderr, "bench: scratch table %s and exchange outbox.bench.%s, dropped at the end\n", c.table, suffix)

	db, store, err := c.open(ctx, &outbox.StoreConfig{Router: outbox.ToExchange("outbox.bench." + suffix)})
	if err != nil {
		return err
	}
	defer db.Close()
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		return err
	}
	defer db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS "`+c.table+`"`) //nolint:errcheck

	conn, err := amqp.Dial(urls[0])
	if err != nil {
		return fmt.Errorf("cannot reach RabbitMQ at %s: %s", redactDSN(urls[0]), x.secrets.scrub(err.Error()))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	exchange := "outbox.bench." + suffix
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}

	var (
		mu        sync.Mutex
		committed = make(map[string]time.Time, *n)
		latencies = make([]time.Duration, 0, *n)
		seen      = make(map[string]bool, *n)
		allIn     = make(chan struct{})
	)
	go func() {
		for d := range deliveries {
			now := time.Now()
			key, _ := d.Headers[relay.KeyHeader].(string)
			mu.Lock()
			if !seen[key] {
				seen[key] = true
				if t, ok := committed[key]; ok {
					latencies = append(latencies, now.Sub(t))
				}
				if len(seen) == *n {
					close(allIn)
				}
			}
			mu.Unlock()
		}
	}()

	write := func(from, to int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		evts := make([]outbox.Event, 0, to-from)
		for i := from; i < to; i++ {
			evts = append(evts, outbox.Event{Type: "bench.tick", Key: strconv.Itoa(i), Payload: []byte(`{"bench":true}`)})
		}
		if err := store.Add(ctx, tx, evts...); err != nil {
			_ = tx.Rollback()
			return err
		}
		now := time.Now()
		mu.Lock()
		for i := from; i < to; i++ {
			committed[strconv.Itoa(i)] = now
		}
		mu.Unlock()
		return tx.Commit()
	}

	startRelay := func() (func() relay.Stats, error) {
		pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URLs: urls, ConnectionName: "outbox-bench",
			Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			return nil, err
		}
		logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		r, err := relay.New(store, pub, &relay.Config{BatchSize: *batch, PollInterval: 10 * time.Millisecond, Logger: logger})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx); _ = pub.Close() }()
		return func() relay.Stats { cancel(); <-done; return r.Stats() }, nil
	}

	var (
		stopRelay func() relay.Stats
		started   time.Time
	)
	if *rate == 0 {
		t0 := time.Now()
		for from := 0; from < *n; from += *perTx {
			if err := write(from, min(from+*perTx, *n)); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "bench: wrote %d messages in %s (%.0f msgs/s, %d per transaction)\n", *n, time.Since(t0).Round(time.Millisecond), float64(*n)/time.Since(t0).Seconds(), *perTx)
		started = time.Now()
		if stopRelay, err = startRelay(); err != nil {
			return err
		}
	} else {
		if stopRelay, err = startRelay(); err != nil {
			return err
		}
		started = time.Now()
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		for i := 0; i < *n; i++ {
			select {
			case <-ctx.Done():
				tick.Stop()
				stopRelay()
				return ctx.Err()
			case <-tick.C:
			}
			if err := write(i, i+1); err != nil {
				tick.Stop()
				stopRelay()
				return err
			}
		}
		tick.Stop()
	}

	progress := time.NewTicker(time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case <-allIn:
			break wait
		case <-ctx.Done():
			stopRelay()
			return ctx.Err()
		case <-progress.C:
			mu.Lock()
			got := len(seen)
			mu.Unlock()
			fmt.Fprintf(stderr, "bench: %d/%d received\n", got, *n)
		}
	}
	elapsed := time.Since(started)
	st := stopRelay()

	mu.Lock()
	defer mu.Unlock()
	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		return latencies[int(p*float64(len(latencies)-1))].Round(100 * time.Microsecond)
	}
	fmt.Fprintf(stdout, "bench: relayed %d messages in %s: %.0f msgs/s (batch %d)\n", *n, elapsed.Round(time.Millisecond), float64(*n)/elapsed.Seconds(), *batch)
	if *rate > 0 { // with everything written first, latency would only measure the queue
		fmt.Fprintf(stdout, "bench: commit to consume at %d msgs/s: p50 %s, p99 %s, max %s\n", *rate, pct(0.5), pct(0.99), pct(1))
	}
	fmt.Fprintf(stdout, "bench: relay %d published, %d failed, %d released\n", st.Published, st.Failed, st.Released)
	return nil
}
