package relay

import (
	"context"
	"log/slog"
	"time"
)

// every runs f at once and then every interval until ctx ends: the
// relay's work beside the loop (purging, reconciling held messages).
func every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *Relay) purge(ctx context.Context) {
	n, err := r.store.PurgePublished(ctx, r.cfg.PurgeAfter)
	r.stats.purged.Add(n)
	switch {
	case err != nil && ctx.Err() == nil:
		r.logger.ErrorContext(ctx, "relay: Purging published messages failed", slog.String("error", err.Error()))
	case n > 0:
		r.logger.InfoContext(ctx, "relay: Purged published messages", slog.Int64("num_purged", n), slog.Duration("older_than", r.cfg.PurgeAfter))
	}
}

// reconcileInterval is how often a relay in ordered mode reconciles.
const reconcileInterval = time.Second

func (r *Relay) reconcile(ctx context.Context) {
	held, unheld, err := r.store.Reconcile(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		r.logger.WarnContext(ctx, "relay: Reconciling held messages failed", slog.String("error", err.Error()))
	case held > 0 || unheld > 0:
		r.logger.DebugContext(ctx, "relay: Reconciled held messages", slog.Int64("num_held", held), slog.Int64("num_unheld", unheld))
	}
}
