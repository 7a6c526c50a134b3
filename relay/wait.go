package relay

import (
	"context"
	"time"
)

// woken says what ended a sleep.
type woken int

const (
	notWoken   woken = iota // the wait ran out, or ctx ended
	wokenFirst              // a value on the first channel
	wokenOther              // a value on another
)

// brokerBackoff waits d after a broker fault, or less: when the publisher
// can tell whether the broker is reachable (AMQPPublisher can), it asks,
// every probeFirst at first and doubling up to probeMax, and the wait ends
// when the broker answers again. Without it, messages written during an
// outage waited out a backoff grown during the outage (up to BackoffMax)
// after the broker was back. A probe opens a connection the next publish
// uses; it claims nothing, so an outage costs the database nothing more.
func (r *Relay) brokerBackoff(ctx context.Context, d time.Duration) {
	pr, ok := r.pub.(prober)
	if !ok {
		r.sleep(ctx, d, nil, nil, nil)
		return
	}
	step := probeFirst
	for left := d; left > 0; {
		step = min(step, left)
		r.sleep(ctx, step, nil, nil, nil)
		left -= step
		if ctx.Err() != nil || left <= 0 {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, left)
		start := time.Now()
		err := pr.probe(pctx)
		cancel()
		if err == nil {
			r.logger.InfoContext(ctx, "relay: The broker answers again")
			return
		}
		left -= time.Since(start) // a probe that waited for the broker took from the backoff
		step = min(2*step, probeMax)
	}
}

// sleep waits for d, the end of ctx or a value on w1, w2 or w3 (nil
// channels never send), whichever comes first, and reports which ended
// it.
func (r *Relay) sleep(ctx context.Context, d time.Duration, w1, w2, w3 <-chan struct{}) woken {
	if r.sleepHook != nil { // tests
		return r.sleepHook(d, w1 != nil || w2 != nil || w3 != nil)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	case <-w1:
		return wokenFirst
	case <-w2:
		return wokenOther
	case <-w3:
		return wokenOther
	}
	return notWoken
}
