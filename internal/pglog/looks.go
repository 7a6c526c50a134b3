package pglog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// What a log table needs beside claiming new events: looks for batches to
// take over (a lease ran out, a relay released its batch) and for failed
// messages due again, and the rotation of its partitions. A relay does
// them from a goroutine of its own (Store.Maintain): a look takes a few
// milliseconds, the rotation 5 to 10 and at times 30, and every message
// committed meanwhile would wait for them if the claims made them. The
// claims then only take what a look found. A claim loop that never calls
// Maintain makes them in its claims, as due.

// How often the looks are made: every lookEvery while claims find work;
// while they find none, twice as long after each look, up to a quarter of
// the lease and at most lookEveryIdle. An idle relay then makes its claims
// and little else, and still notices a lapsed lease within a quarter of
// it. The rotation is due every second.
const (
	lookEvery     = 250 * time.Millisecond
	lookEveryIdle = 2 * time.Second
	rotateEvery   = time.Second
)

// tendedFor is how long claims leave the looks and the rotation to
// Maintain after a call of it: a relay calls it every 100ms, and the
// claims take the work back if it stops (or backs off after failures).
const tendedFor = time.Second

// looks is a Backend's schedule of looks and rotations; its mu guards it.
type looks struct {
	nextScan, nextFailed, nextRotate time.Time
	lookEvery                        time.Duration // longer while claims find nothing
	tendedAt                         time.Time     // the latest call of Maintain

	// The next claim takes over a batch, or claims failed messages, at
	// once: a look found one, or this process released a batch or
	// failed a message.
	scanNow, failedNow bool
}

// Maintain is Store.Maintain on a log table: it makes the looks and the
// rotation that are due, and leaves what the looks found to the next
// claim.
func (b *Backend) Maintain(ctx context.Context, db *sql.DB) error {
	b.mu.Lock()
	b.tendedAt = b.now()
	b.mu.Unlock()
	var errs []error
	if b.due(&b.nextScan, 0) {
		cand, err := b.unfinished(ctx, db, 0, true)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("looking for batches to take over: %w", err))
		case cand != nil:
			b.scanSoon()
		}
	}
	if b.due(&b.nextFailed, 0) {
		var found bool
		switch err := db.QueryRowContext(ctx, b.q.failedDue).Scan(&found); {
		case err != nil:
			errs = append(errs, fmt.Errorf("looking for failed messages due again: %w", err))
		case found:
			b.failedSoon()
		}
	}
	if b.due(&b.nextRotate, rotateEvery) {
		if err := b.rotateAll(ctx, db); err != nil {
			errs = append(errs, fmt.Errorf("rotating the partitions: %w", err))
		}
	}
	return errors.Join(errs...)
}

// tended says whether Maintain makes the looks and the rotation now.
func (b *Backend) tended() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.tendedAt.IsZero() && b.now().Sub(b.tendedAt) < tendedFor
}

// lookNow says whether this claim makes the look of *now and *next: at
// once when *now is set (it is cleared), or else, unless Maintain makes
// the looks, when *next is due.
func (b *Backend) lookNow(now *bool, next *time.Time, tended bool) bool {
	b.mu.Lock()
	if *now {
		*now = false
		b.mu.Unlock()
		return true
	}
	b.mu.Unlock()
	return !tended && b.due(next, 0)
}

// due says whether the time *next has come, and if so moves it on by every
// (by the current look interval when every is 0).
func (b *Backend) due(next *time.Time, every time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if now.Before(*next) {
		return false
	}
	if every == 0 {
		every = b.lookEvery
	}
	*next = now.Add(every)
	return true
}

// lookedFor adapts the look interval after a claim: back to lookEvery when
// the claim found messages, twice as long (up to a quarter of the lease,
// at most lookEveryIdle) when it found none.
func (b *Backend) lookedFor(empty bool, lease time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !empty {
		b.lookEvery = lookEvery
		return
	}
	b.lookEvery = max(lookEvery, min(2*b.lookEvery, lease/4, lookEveryIdle))
}

// scanSoon and failedSoon make the next claim look at once, and the looks
// frequent again: a look found work, or this process released a batch or
// failed a message.
func (b *Backend) scanSoon()   { b.soon(&b.scanNow) }
func (b *Backend) failedSoon() { b.soon(&b.failedNow) }

func (b *Backend) soon(now *bool) {
	b.mu.Lock()
	*now = true
	b.lookEvery = lookEvery
	b.mu.Unlock()
}
