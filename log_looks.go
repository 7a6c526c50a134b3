package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
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

// looks is a log store's schedule of looks and rotations; its logStore's
// mu guards it.
type looks struct {
	nextScan, nextFailed, nextRotate time.Time
	lookEvery                        time.Duration // longer while claims find nothing
	tendedAt                         time.Time     // the latest call of Maintain

	// The next claim takes over a batch, or claims failed messages, at
	// once: a look found one, or this process released a batch or
	// failed a message.
	scanNow, failedNow bool
}

func (ls *logStore) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	var msgs []Message
	step := func(take func() ([]Message, error)) error {
		more, err := take()
		if len(msgs) == 0 {
			msgs = more // mostly the only step: no copy
		} else {
			msgs = append(msgs, more...)
		}
		return err
	}
	tended := ls.tended()
	err := func() error {
		if ls.lookNow(&ls.failedNow, &ls.nextFailed, tended) {
			if err := step(func() ([]Message, error) { return ls.claimFailed(ctx, db, n, lease) }); err != nil {
				return err
			}
		}
		if len(msgs) < n && ls.lookNow(&ls.scanNow, &ls.nextScan, tended) {
			if err := step(func() ([]Message, error) {
				return ls.takeOverTx(ctx, db, n-len(msgs), len(msgs) == 0, lease)
			}); err != nil {
				return err
			}
		}
		if len(msgs) < n {
			return step(func() ([]Message, error) { return ls.claimNew(ctx, db, n-len(msgs), lease) })
		}
		return nil
	}()
	if err != nil && len(msgs) == 0 {
		return nil, err
	}
	ls.lookedFor(len(msgs) == 0, lease)
	// Messages already claimed are returned even if a later step failed:
	// the next claim meets the failure again.
	if !tended && ls.due(&ls.nextRotate, rotateEvery) {
		if err := ls.rotateAll(ctx, db); err != nil && ctx.Err() == nil {
			ls.s.logger.WarnContext(ctx, "outbox: Rotating the partitions of a log table failed; trying again in a second",
				slog.String("table", ls.s.t.full), slog.Any("error", err))
		}
	}
	return msgs, nil
}

// tend is Store.Maintain on a log table: it makes the looks and the
// rotation that are due, and leaves what the looks found to the next
// claim.
func (ls *logStore) tend(ctx context.Context, db *sql.DB) error {
	ls.mu.Lock()
	ls.tendedAt = ls.now()
	ls.mu.Unlock()
	var errs []error
	if ls.due(&ls.nextScan, 0) {
		cand, err := ls.unfinished(ctx, db, 0, true)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("looking for batches to take over: %w", err))
		case cand != nil:
			ls.scanSoon()
		}
	}
	if ls.due(&ls.nextFailed, 0) {
		var found bool
		switch err := db.QueryRowContext(ctx, ls.failedDueSQL).Scan(&found); {
		case err != nil:
			errs = append(errs, fmt.Errorf("looking for failed messages due again: %w", err))
		case found:
			ls.failedSoon()
		}
	}
	if ls.due(&ls.nextRotate, rotateEvery) {
		if err := ls.rotateAll(ctx, db); err != nil {
			errs = append(errs, fmt.Errorf("rotating the partitions: %w", err))
		}
	}
	return errors.Join(errs...)
}

// tended says whether Maintain makes the looks and the rotation now.
func (ls *logStore) tended() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return !ls.tendedAt.IsZero() && ls.now().Sub(ls.tendedAt) < tendedFor
}

// lookNow says whether this claim makes the look of *now and *next: at
// once when *now is set (it is cleared), or else, unless Maintain makes
// the looks, when *next is due.
func (ls *logStore) lookNow(now *bool, next *time.Time, tended bool) bool {
	ls.mu.Lock()
	if *now {
		*now = false
		ls.mu.Unlock()
		return true
	}
	ls.mu.Unlock()
	return !tended && ls.due(next, 0)
}

// due says whether the time *next has come, and if so moves it on by every
// (by the current look interval when every is 0).
func (ls *logStore) due(next *time.Time, every time.Duration) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	now := ls.now()
	if now.Before(*next) {
		return false
	}
	if every == 0 {
		every = ls.lookEvery
	}
	*next = now.Add(every)
	return true
}

// lookedFor adapts the look interval after a claim: back to lookEvery when
// the claim found messages, twice as long (up to a quarter of the lease,
// at most lookEveryIdle) when it found none.
func (ls *logStore) lookedFor(empty bool, lease time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !empty {
		ls.lookEvery = lookEvery
		return
	}
	ls.lookEvery = max(lookEvery, min(2*ls.lookEvery, lease/4, lookEveryIdle))
}

// scanSoon and failedSoon make the next claim look at once, and the looks
// frequent again: a look found work, or this process released a batch or
// failed a message.
func (ls *logStore) scanSoon()   { ls.soon(&ls.scanNow) }
func (ls *logStore) failedSoon() { ls.soon(&ls.failedNow) }

func (ls *logStore) soon(now *bool) {
	ls.mu.Lock()
	*now = true
	ls.lookEvery = lookEvery
	ls.mu.Unlock()
}
