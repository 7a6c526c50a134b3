package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/acemq/outbox/internal/pgschema"
)

// DeadRecord is the record of a message the inbox dead-lettered.
type DeadRecord struct {
	MessageID  string
	Attempts   int
	LastError  string
	ReceivedAt time.Time // its first delivery
	DeadAt     time.Time
}

// Records counts a consumer's records by state.
type Records struct {
	Handled int64 // applied; later deliveries are duplicates
	Failing int64 // failed, to be tried again at the next delivery
	Dead    int64 // dead-lettered; Retry makes them eligible again
}

// Records counts the consumer's records.
func (ib *Inbox) Records(ctx context.Context) (Records, error) {
	var r Records
	if err := ib.db.QueryRowContext(ctx, ib.q.records, ib.consumer).Scan(&r.Handled, &r.Failing, &r.Dead); err != nil {
		return r, ib.wrap("counting the records of consumer "+ib.consumer, err)
	}
	return r, nil
}

// Dead lists up to limit records of messages the consumer dead-lettered,
// the oldest first.
func (ib *Inbox) Dead(ctx context.Context, limit int) ([]DeadRecord, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("inbox: Dead: limit must be positive (got %d)", limit)
	}
	return ib.dead(ctx, limit, 0, "")
}

// DeadQuery selects a page of dead-lettered records for FindDead.
type DeadQuery struct {
	// Limit is the most records returned (at least 1).
	Limit int
	// After, when set, is the last record of the previous page (as
	// FindDead returned it): the page starts after it.
	After *DeadRecord
}

// FindDead lists the records of messages the consumer dead-lettered a
// page at a time, the oldest dead first (by DeadAt, then MessageID): pass
// the last record of a page as the next query's After.
func (ib *Inbox) FindDead(ctx context.Context, q DeadQuery) ([]DeadRecord, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("inbox: FindDead: limit must be positive (got %d)", q.Limit)
	}
	if q.After == nil {
		return ib.dead(ctx, q.Limit, 0, "")
	}
	if q.After.DeadAt.IsZero() || q.After.MessageID == "" {
		return nil, fmt.Errorf("inbox: FindDead: After is not a dead record (its DeadAt or MessageID is empty)")
	}
	return ib.dead(ctx, q.Limit, q.After.DeadAt.UnixMicro(), q.After.MessageID)
}

// dead lists up to limit dead records after (afterUs, afterID), from the
// first when afterUs is 0.
func (ib *Inbox) dead(ctx context.Context, limit int, afterUs int64, afterID string) ([]DeadRecord, error) {
	args := []any{ib.consumer, limit, afterUs, afterID}
	if ib.mysql {
		args = []any{ib.consumer, afterUs, afterUs, afterID, limit}
	}
	rows, err := ib.db.QueryContext(ctx, ib.q.dead, args...)
	if err != nil {
		return nil, ib.wrap("listing dead-lettered messages", err)
	}
	defer rows.Close()
	var out []DeadRecord
	for rows.Next() {
		var (
			r                DeadRecord
			received, deadAt int64 // microseconds since the epoch
		)
		if err := rows.Scan(&r.MessageID, &r.Attempts, &r.LastError, &received, &deadAt); err != nil {
			return nil, ib.wrap("listing dead-lettered messages", err)
		}
		r.ReceivedAt, r.DeadAt = time.UnixMicro(received), time.UnixMicro(deadAt)
		out = append(out, r)
	}
	return out, ib.wrap("listing dead-lettered messages", rows.Err())
}

// Retry makes the dead-lettered messages named by ids eligible again: their
// attempts start from zero, and the next delivery of each (replayed from
// the dead-letter queue, see the package doc) runs the handler. It returns
// how many records it changed; ids without a dead record are left alone.
func (ib *Inbox) Retry(ctx context.Context, ids ...string) (int64, error) {
	tx, err := ib.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, ib.wrap("re-arming dead-lettered messages", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	var total int64
	for _, id := range ids {
		res, err := tx.ExecContext(ctx, ib.q.revive, ib.consumer, id)
		if err != nil {
			return 0, ib.wrap("re-arming dead-lettered message "+id, err)
		}
		n, _ := res.RowsAffected()
		total += n
	}
	if err := tx.Commit(); err != nil {
		return 0, ib.wrap("re-arming dead-lettered messages", err)
	}
	return total, nil
}

// DeadAmong counts the messages named by ids that the consumer
// dead-lettered: the records Retry(ctx, ids...) would make eligible again
// now (an id given twice counts once).
func (ib *Inbox) DeadAmong(ctx context.Context, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	query, args := ib.deadAmongQuery(ids)
	if err := ib.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, ib.wrap("counting dead-lettered messages", err)
	}
	return n, nil
}

// RetryAllDead makes every message the consumer dead-lettered eligible
// again, as Retry does, and returns how many.
func (ib *Inbox) RetryAllDead(ctx context.Context) (int64, error) {
	res, err := ib.db.ExecContext(ctx, ib.q.reviveAll, ib.consumer)
	if err != nil {
		return 0, ib.wrap("re-arming dead-lettered messages", err)
	}
	return res.RowsAffected()
}

// wrap prefixes a database error, with advice when the table is missing.
func (ib *Inbox) wrap(doing string, err error) error {
	if err == nil {
		return nil
	}
	if a := advice(err); a != "" {
		return fmt.Errorf("inbox: %s in %s: %w (%s)", doing, ib.name, err, a)
	}
	return fmt.Errorf("inbox: %s in %s: %w", doing, ib.name, err)
}

// Purgeable counts the records Purge(ctx, olderThan) would delete now.
func (ib *Inbox) Purgeable(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Purgeable: age must not be negative (got %s)", olderThan)
	}
	var n int64
	if err := ib.db.QueryRowContext(ctx, ib.q.purgeable, ib.consumer, olderThan.Microseconds()).Scan(&n); err != nil {
		return 0, ib.wrap("counting purgeable records", err)
	}
	return n, nil
}

// PurgeBatchSize is how many rows one statement of Purge deletes.
const PurgeBatchSize = 5000

// Purge deletes the consumer's records of messages handled or dead-lettered
// more than olderThan ago, in batches of PurgeBatchSize, and returns how
// many it deleted. A message redelivered after its record is purged would
// be handled again: keep records longer than the broker may redeliver and
// the outbox relay may publish twice (its lease, plus the longest outage
// you ride out). Records of messages still failing are kept.
func (ib *Inbox) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Purge: age must not be negative (got %s)", olderThan)
	}
	total, err := pgschema.DeleteInBatches(ctx, ib.db, PurgeBatchSize, nil, ib.q.purge, ib.consumer, olderThan.Microseconds())
	return total, ib.wrap("purging", err)
}
