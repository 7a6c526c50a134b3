package pglog

import (
	"context"
	"database/sql"
	"time"
)

// What package outbox's tests set and read of a Backend (export_test.go):
// nothing else calls these.

// SetLow sets the low-water mark, below which b takes every batch to be
// finished; Low returns it.
func (b *Backend) SetLow(low int64) {
	b.mu.Lock()
	b.low = low
	b.mu.Unlock()
}

func (b *Backend) Low() int64 { return b.lowMark() }

// SetClock makes b tell the time from now.
func (b *Backend) SetClock(now func() time.Time) {
	b.mu.Lock()
	b.now = now
	b.mu.Unlock()
}

// LookEvery returns how often b looks for batches to take over and for
// failed messages due again.
func (b *Backend) LookEvery() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lookEvery
}

// SetServer makes b take its low-water mark to have been learnt from
// server, as a backend that has failed over to another.
func (b *Backend) SetServer(server string) {
	b.mu.Lock()
	b.server = server
	b.mu.Unlock()
}

// RotateBatches rotates the batch and settle tables now, as Maintain does
// every second.
func (b *Backend) RotateBatches(ctx context.Context, db *sql.DB) error {
	var latest sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT max(batch_id) FROM `+b.t.Batch).Scan(&latest); err != nil || !latest.Valid {
		return err
	}
	return b.rotateBatches(ctx, db, latest.Int64)
}
