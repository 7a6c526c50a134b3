package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/periodic"
)

// release gives msgs back without an attempt and returns the error of the
// release, a lost lease aside.
func (r *Relay) release(ctx context.Context, until time.Time, msgs []outbox.Message, reason string) error {
	if len(msgs) == 0 {
		return nil
	}
	n, err := r.settle(ctx, until, "releasing", len(msgs), func(ctx context.Context) error {
		return r.store.Release(ctx, msgs...)
	})
	r.stats.released.Add(n)
	if n > 0 {
		r.obs.Released(ctx, int(n), reason)
	}
	return err
}

// settle runs a mark or release of n messages, retrying it (see retrying),
// and returns how many were settled and its error, lost leases aside:
// those are counted and reported by settled.
func (r *Relay) settle(ctx context.Context, until time.Time, what string, n int, op func(context.Context) error) (int64, error) {
	err := r.retrying(ctx, until, what, op)
	settled := r.settled(ctx, what, n, err)
	if errors.Is(err, outbox.ErrLeaseLost) {
		return settled, nil
	}
	return settled, err
}

// retrying runs a settle and, when it fails for a reason other than a lost
// lease (a database session terminated, a connection dropped), runs it
// again on a fresh connection of the pool, backing off, until it works or
// the time left before until is too short. A table (or its schema, or a
// column) that is not there is not retried: no connection brings it back
// (a tenant's table dropped under a relay of many tables). Marks and releases are fenced by
// the claim token, so a retry can never touch a row that another relay has
// claimed since; it saves the batch from being published a second time
// after the lease.
func (r *Relay) retrying(ctx context.Context, until time.Time, what string, op func(context.Context) error) error {
	delay := settleRetryMin
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil || errors.Is(err, outbox.ErrLeaseLost) || fatal(err) || missing(err) || ctx.Err() != nil ||
			time.Now().Add(delay).After(until) {
			return err
		}
		r.logger.WarnContext(ctx, "relay: Settling failed; retrying on another connection",
			slog.String("operation", what), slog.Int("attempt", attempt), slog.String("error", err.Error()), slog.Duration("retry_in", delay))
		if !periodic.Sleep(ctx, delay) {
			return err
		}
		delay = min(2*delay, settleRetryMax)
	}
}

// settled counts lost leases and logs a marking error, and returns how many
// of the n messages were settled. A lost lease means another relay has the
// message now; any other error leaves the messages claimed until their lease
// ends, after which they are published again: a duplicate, never a loss.
func (r *Relay) settled(ctx context.Context, what string, n int, err error) int64 {
	if err == nil {
		return int64(n)
	}
	var lost *outbox.LeaseLostError
	if errors.As(err, &lost) {
		r.stats.leasesLost.Add(int64(len(lost.IDs)))
		r.obs.LeasesLost(ctx, len(lost.IDs))
		return int64(n - len(lost.IDs)) // the store has logged it
	}
	r.logger.ErrorContext(ctx, "relay: Settling a batch failed; its messages will be retried after the lease",
		slog.String("operation", what), slog.Int("num_messages", n), slog.String("error", err.Error()))
	return 0
}
