package relay

import (
	"context"
	"log/slog"
	"time"
)

// purgeLoop purges at once and then every PurgeInterval until ctx ends.
func (r *Relay) purgeLoop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.PurgeInterval)
	defer tick.Stop()
	for {
		r.purge(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *Relay) purge(ctx context.Context) {
	n, err := r.store.(Purger).PurgePublished(ctx, r.cfg.PurgeAfter)
	r.stats.purged.Add(n)
	switch {
	case err != nil && ctx.Err() == nil:
		r.logger.ErrorContext(ctx, "relay: Purging published messages failed", slog.String("error", err.Error()))
	case n > 0:
		r.logger.InfoContext(ctx, "relay: Purged published messages", slog.Int64("num_purged", n), slog.Duration("older_than", r.cfg.PurgeAfter))
	}
}
