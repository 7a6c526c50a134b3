package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acemq/outbox/relay"
)

// phaseObserver records how long the relay's claims, publishes (confirms
// included) and settles took, to show what bounds a figure.
type phaseObserver struct {
	relay.NopObserver
	mu                     sync.Mutex
	claim, publish, settle []time.Duration
	batch                  []float64
	claims                 atomic.Int64 // every claim, the empty ones too
}

func (o *phaseObserver) Claimed(_ context.Context, n int, took time.Duration, err error) {
	o.claims.Add(1)
	if n > 0 && err == nil {
		o.mu.Lock()
		o.claim, o.batch = append(o.claim, took), append(o.batch, float64(n))
		o.mu.Unlock()
	}
}

func (o *phaseObserver) Published(_ context.Context, _ int, took time.Duration) {
	o.mu.Lock()
	o.publish = append(o.publish, took)
	o.mu.Unlock()
}

func (o *phaseObserver) Settled(_ context.Context, took time.Duration, _ error) {
	o.mu.Lock()
	o.settle = append(o.settle, took)
	o.mu.Unlock()
}

// String summarises the phases: p50, p99 and max of each (a stall hits few
// batches, and every message queued behind it), the mean batch.
func (o *phaseObserver) String() string {
	if o == nil {
		return "in another process (its phases are not measured here)"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.claim) == 0 {
		return "no batches"
	}
	p := func(d []time.Duration) string {
		if len(d) == 0 {
			return "none"
		}
		s := slices.Sorted(slices.Values(d))
		return fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms", ms(percentile(s, 0.5)), ms(percentile(s, 0.99)), ms(s[len(s)-1]))
	}
	var sum float64
	for _, n := range o.batch {
		sum += n
	}
	return fmt.Sprintf("%d batches of %.1f messages on average; claim %s; publish with confirms %s; settle %s",
		len(o.batch), sum/float64(len(o.batch)), p(o.claim), p(o.publish), p(o.settle))
}

// percentile returns the p-th value of sorted, 0 ≤ p ≤ 1.
func percentile[T any](sorted []T, p float64) T {
	return sorted[int(p*float64(len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// figure is one measurement over several runs.
type figure []float64

// format prints the median with its unit and the range, "4.5 ms [3.8–5.4]".
func (f figure) format(verb, unit string) string {
	s := slices.Sorted(slices.Values(f))
	return fmt.Sprintf(verb+unit+" ["+verb+"–"+verb+"]", percentile(s, 0.5), s[0], s[len(s)-1])
}

func (f figure) String() string { return f.format("%.0f", "") }

func (f figure) median() float64 { return percentile(slices.Sorted(slices.Values(f)), 0.5) }
