package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/acemq/outbox/internal/periodic"
)

// every runs f at once and then every interval until ctx ends: the
// relay's work beside the pipeline (purging, reconciling held messages).
// Maintaining backs off after failures instead.
var every = periodic.Run

// purge deletes what is due; it returns an error only when nothing can
// repair it (see fatal), which stops Run.
func (r *Relay) purge(ctx context.Context) error {
	n, err := r.store.PurgePublished(ctx, r.cfg.PurgeAfter)
	r.stats.purged.Add(n)
	switch {
	case fatal(err):
		return err
	case err != nil && ctx.Err() == nil:
		r.logger.ErrorContext(ctx, "relay: Purging published messages failed", slog.String("error", err.Error()))
	case n > 0:
		r.logger.InfoContext(ctx, "relay: Purged published messages", slog.Int64("num_purged", n), slog.Duration("older_than", r.cfg.PurgeAfter))
	}
	return nil
}

// maintainEvery is how often the relay offers its store the upkeep beside
// the claims (Store.Maintain does only what is due).
const maintainEvery = 100 * time.Millisecond

// maintain calls Store.Maintain every maintainEvery until ctx ends, and
// after a failure again after the relay's backoff. It returns nil when
// ctx ends, or an error nothing can repair (see fatal), which stops Run.
func (r *Relay) maintain(ctx context.Context) error {
	failures := 0
	for {
		wait := r.idleWait(maintainEvery)
		if err := r.store.Maintain(ctx); fatal(err) {
			return err
		} else if err != nil && ctx.Err() == nil {
			failures++
			wait = r.backoff(failures)
			r.logger.WarnContext(ctx, "relay: Maintaining the table failed; its claims do the work meanwhile",
				slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		} else {
			failures = 0
		}
		if !periodic.Sleep(ctx, wait) {
			return nil
		}
	}
}

// dueMover is a Store that moves its delayed messages into the table when
// they fall due, on the clock of the next due time (*outbox.Store):
// MoveDue says when that is. A Store without it has Maintain move them.
type dueMover interface {
	MoveDue(ctx context.Context) (next time.Time, err error)
}

// Bounds on the mover's waits between two calls of MoveDue.
const (
	// dueLookEvery is the longest: another process may write a delayed
	// message due sooner than the next the store knows of. An idle relay
	// of a group waits longer (see GroupConfig.IdleClaims), up to
	// dueLookMax, well within the 10 minutes after which Maintain would
	// take the moving over.
	dueLookEvery = time.Second
	dueLookMax   = 5 * time.Minute
	// moveGap is the shortest: while delayed messages fall due without a
	// break, each call moves what fell due in the last moveGap, in one
	// short statement, rather than the few thousand of a longer wait in one
	// long one that holds back the claims behind it.
	moveGap = 20 * time.Millisecond
)

// moveDue calls MoveDue when the next delayed message is due, at least
// every dueLookEvery and never sooner than moveGap apart, and after a
// failure again after the relay's backoff. It returns nil when ctx ends,
// or an error nothing can repair (see fatal), which stops Run.
func (r *Relay) moveDue(ctx context.Context, m dueMover) error {
	failures := 0
	for {
		next, err := m.MoveDue(ctx)
		wait := min(r.idleWait(dueLookEvery), dueLookMax)
		switch {
		case fatal(err):
			return err
		case err != nil && ctx.Err() == nil:
			failures++
			wait = r.backoff(failures)
			r.logger.WarnContext(ctx, "relay: Moving the due delayed messages into the table failed",
				slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		case !next.IsZero():
			failures = 0
			wait = max(min(wait, time.Until(next)), moveGap)
		default:
			failures = 0
		}
		if !periodic.Sleep(ctx, wait) {
			return nil
		}
	}
}

// reconcileInterval is how often a relay in ordered mode reconciles.
const reconcileInterval = time.Second

// reconcile runs the store's Reconcile once; it returns an error only
// when nothing can repair it (see fatal), which stops Run.
func (r *Relay) reconcile(ctx context.Context) error {
	held, unheld, err := r.store.Reconcile(ctx)
	switch {
	case fatal(err):
		return err
	case err != nil && ctx.Err() == nil:
		r.logger.WarnContext(ctx, "relay: Reconciling held messages failed", slog.String("error", err.Error()))
	case held > 0 || unheld > 0:
		r.logger.DebugContext(ctx, "relay: Reconciled held messages", slog.Int64("num_held", held), slog.Int64("num_unheld", unheld))
	}
	return nil
}
