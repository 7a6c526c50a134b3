package mysqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/acemq/outbox/internal/backend"
)

// Pending implements backend.Backend: the entries of state_idx with
// published_at NULL, whatever else they are; it reads as many index
// entries as there are pending messages, none of the published history.
func (s *Store) Pending(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, s.q.pending).Scan(&n)
	return n, err
}

// Counts implements backend.Backend.
func (s *Store) Counts(ctx context.Context, db *sql.DB, limit int64) (backend.Counts, error) {
	var (
		c              backend.Counts
		oldest, oldRdy int64
		err            error
	)
	if limit <= 0 {
		err = db.QueryRowContext(ctx, s.q.counts).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Held, &c.Parked,
			&oldest, &oldRdy, &c.PublishedLastHour, &c.BlockedKeys)
	} else {
		err = db.QueryRowContext(ctx, s.q.countsLimited, limit, limit, limit, limit, limit, limit).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Held, &c.Parked,
			&oldest, &oldRdy, &c.BlockedKeys)
	}
	c.OldestPending, c.OldestReady = time.Duration(max(oldest, 0))*time.Microsecond, time.Duration(max(oldRdy, 0))*time.Microsecond
	return c, err
}

// Parked implements backend.Backend.
func (s *Store) Parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, s.q.parkedList, q.EventType, q.EventType, q.Key, q.Key, q.ErrorText, q.ErrorText,
		q.AfterParkedAt, q.AfterParkedAt, q.AfterSeq, q.Limit)
	if err != nil {
		return nil, err
	}
	return scanRows(rows)
}

// idsChunk bounds the ids of one statement of ChangeParked.
const idsChunk = 500

// ChangeParked implements backend.Backend.
func (s *Store) ChangeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	defer s.low.lower(0) // retried ones are ready, and the messages behind them
	if ids == nil {
		res, err := db.ExecContext(ctx, s.q.retryAll)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err == nil { // the held messages of keys without a failed one
			_, err = s.change(ctx, db, s.q.unholdFind, "unhold", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = FALSE WHERE seq IN ({in}) AND {held}`)
		}
		return n, err
	}
	kind, text := "retry", `UPDATE {table} FORCE INDEX (id_idx) SET parked_at = NULL, attempts = 0, available_at = {now} WHERE id IN ({in}) AND {parked}`
	if discard {
		kind, text = "discard", `UPDATE {table} FORCE INDEX (id_idx) SET published_at = {now}, discarded_at = {now} WHERE id IN ({in}) AND {parked}`
	}
	var total int64
	for start := 0; start < len(ids); start += idsChunk {
		chunk := ids[start:min(start+idsChunk, len(ids))]
		// The keys of the parked ones, whose held messages come back.
		rows, err := db.QueryContext(ctx, s.list("parked-keys", `SELECT DISTINCT event_key FROM {table} FORCE INDEX (id_idx) WHERE id IN ({in}) AND {parked} AND event_key <> ''`, len(chunk)), args(chunk)...)
		if err != nil {
			return total, err
		}
		keys, err := scanStrings(rows)
		if err != nil {
			return total, err
		}
		res, err := db.ExecContext(ctx, s.list(kind, text, len(chunk)), args(chunk)...)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil {
			return total, err
		}
		if err := s.unhold(ctx, db, keys); err != nil {
			return total, err
		}
	}
	return total, nil
}

func scanStrings(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Purge implements backend.Backend. The cutoff is read once, so that the
// purge ends; each statement runs at READ COMMITTED, locking the rows it
// deletes and no gap (a next-key lock at the end of the range could hold
// up the marks that add published rows there).
func (s *Store) Purge(ctx context.Context, db *sql.DB, olderThan time.Duration, batch int, progress func(int64)) (int64, error) {
	var cutoff string
	if err := db.QueryRowContext(ctx, `SELECT CAST(`+now+` - INTERVAL ? MICROSECOND AS CHAR)`, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, err
	}
	var total int64
	for {
		var n int64
		err := readCommitted(ctx, db, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, s.q.purge, cutoff, batch)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
		total += n
		if err != nil {
			return total, err
		}
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// Purgeable implements backend.Backend.
func (s *Store) Purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, s.q.purgeable, olderThan.Microseconds()).Scan(&n)
	return n, err
}
