package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/relay"
)

// latency writes one message per transaction at the configured rate,
// shared by the writers, while the relay runs, and reports the time from
// each commit to its first delivery.
func (b *bencher) latency(ctx context.Context, out io.Writer) error {
	pcts := []float64{0.5, 0.9, 0.99, 1}
	figures := make([]figure, len(pcts))
	for run := 1; run <= b.o.runs; run++ {
		lat, err := b.latencyRun(ctx)
		if err != nil {
			return err
		}
		slices.Sort(lat)
		for i, p := range pcts {
			figures[i] = append(figures[i], ms(percentile(lat, p)))
		}
		fmt.Fprintf(b.stderr, "bench: run %d: p50 %.1fms p99 %.1fms; relay: %s\n", run, figures[0][run-1], figures[2][run-1], b.phases)
	}
	fmt.Fprintf(out, "bench: commit to consume at %g msgs/s, %d writer(s), one message per transaction: p50 %s, p90 %s, p99 %s, max %s\n",
		b.o.rate, b.o.writers, figures[0].format("%.1f", " ms"), figures[1].format("%.1f", " ms"), figures[2].format("%.1f", " ms"), figures[3].format("%.1f", " ms"))
	return nil
}

func (b *bencher) latencyRun(ctx context.Context) ([]time.Duration, error) {
	if _, err := b.db.ExecContext(ctx, `TRUNCATE "`+b.table+`"`); err != nil {
		return nil, err
	}
	var (
		mu        sync.Mutex
		committed = make(map[string]time.Time, b.o.messages)
		arrived   = make(map[string]time.Time, b.o.messages)
	)
	wait, err := b.consume(ctx, b.o.messages, func(d *amqp.Delivery) {
		now := time.Now()
		key, _ := d.Headers[relay.KeyHeader].(string)
		mu.Lock()
		arrived[key] = now
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	stop, err := b.startRelay(ctx, b.store)
	if err != nil {
		return nil, err
	}
	defer stop()

	// Each writer writes every writers-th message on its own schedule.
	interval := time.Duration(float64(time.Second) * float64(b.o.writers) / b.o.rate)
	errs := make(chan error, b.o.writers)
	for w := range b.o.writers {
		go func() {
			next := time.Now().Add(time.Duration(w) * interval / time.Duration(b.o.writers))
			for i := w; i < b.o.messages; i += b.o.writers {
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
						errs <- ctx.Err()
						return
					case <-time.After(d):
					}
				}
				next = next.Add(interval)
				key := strconv.Itoa(i)
				if err := b.write(ctx, b.store, []string{key}); err != nil {
					errs <- err
					return
				}
				now := time.Now()
				mu.Lock()
				committed[key] = now
				mu.Unlock()
			}
			errs <- nil
		}()
	}
	for range b.o.writers {
		if err := <-errs; err != nil {
			return nil, err
		}
	}
	if err := wait(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for k, t := range committed {
		if a, ok := arrived[k]; ok {
			lat = append(lat, max(a.Sub(t), 0)) // a delivery can beat the commit's return to the writer
		}
	}
	if len(lat) == 0 {
		return nil, fmt.Errorf("no latency measured")
	}
	return lat, nil
}
