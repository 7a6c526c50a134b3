package mysqlstore

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/backend"
)

// The delayed messages (outbox.Event.NotBefore) wait in the scheduled
// table beside the outbox table until they are due; Promote then moves
// them into it in one short transaction, as a writer would write them then
// (the order trigger numbers them on an ordered table). Claims never see a
// message that is not due.

// schedQueries are the statements on the table of delayed messages that
// take no list of values, built once.
type schedQueries struct {
	nextDue, lockDue, count, list string
}

func newSchedQueries(sched string) schedQueries {
	return schedQueries{
		nextDue: `SELECT TIMESTAMPDIFF(MICROSECOND, ` + now + `, MIN(due)) FROM ` + sched + ` FORCE INDEX (due_idx) WHERE refused = FALSE`,
		lockDue: `SELECT seq, id FROM ` + sched + ` FORCE INDEX (due_idx)
WHERE refused = FALSE AND due <= ` + now + ` ORDER BY due LIMIT ? FOR UPDATE SKIP LOCKED`,
		count: `SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM ` + sched + ` LIMIT ?) AS c),
	(SELECT TIMESTAMPDIFF(MICROSECOND, ` + now + `, MIN(due)) FROM ` + sched + ` FORCE INDEX (due_idx) WHERE refused = FALSE)`,
		list: `SELECT seq, id, event_type, event_key, exchange, routing_key, payload, content_type, headers,
	` + micros("created_at") + `, ` + micros("due") + `, coalesce(last_error, '')
FROM ` + sched + `
WHERE (? = '' OR event_type = ?) AND (? = '' OR event_key = ?)
  AND (? = 0 OR (due, id) > (TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND, ?))
ORDER BY due, id LIMIT ?`,
	}
}

// ScheduleStatements implements backend.Backend. Its id key is named as
// the table's (id_idx), so that a duplicate reads as one (DuplicateID).
func (s *Store) ScheduleStatements() []string {
	return []string{strings.NewReplacer("{scheduled}", s.sched, "{marker}", SchemaMarker).Replace(`CREATE TABLE IF NOT EXISTS {scheduled} (
    seq           BIGINT        NOT NULL AUTO_INCREMENT,
    id            CHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_type    VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_key     VARBINARY(2048) NOT NULL DEFAULT '',
    exchange      VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    routing_key   VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    payload       LONGBLOB      NOT NULL,
    content_type  VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'application/json',
    headers       JSON          NOT NULL,
    created_at    DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    due           DATETIME(6)   NOT NULL,
    -- refused: due, and not moved: its ID was written into the table
    -- meanwhile (last_error says so); it stays for an operator.
    refused       BOOLEAN       NOT NULL DEFAULT FALSE,
    last_error    TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY id_idx (id),
    KEY due_idx (refused, due)
) ENGINE=InnoDB COMMENT='{marker}: the delayed messages of the outbox table'`)}
}

// ScheduleSQL implements backend.Backend.
func (s *Store) ScheduleSQL(n int) string {
	return s.list("schedule", `INSERT INTO {scheduled} (id, event_type, event_key, exchange, routing_key, payload, content_type, headers, due) VALUES `+
		strings.TrimSuffix(strings.Repeat("(?,?,?,?,?,?,?,?,"+now+" + INTERVAL ? MICROSECOND),", n), ","), n)
}

// Promote implements backend.Backend: a look without locks first at when
// the next is due (the first entry of due_idx), then, if one is, one
// transaction at READ COMMITTED (no gap locks) that locks the due rows,
// skipping those another relay moves, and moves them; having moved fewer
// than n, it looks again.
func (s *Store) Promote(ctx context.Context, db *sql.DB, n int, reason string) (moved, refused int64, next time.Duration, err error) {
	if next, err := s.nextDue(ctx, db); err != nil || next > 0 {
		return 0, 0, next, err
	}
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.sq.lockDue, n)
		if err != nil {
			return err
		}
		bySeq := map[string]int64{}
		var ids []string
		for rows.Next() {
			var (
				seq int64
				id  string
			)
			if err := rows.Scan(&seq, &id); err != nil {
				rows.Close()
				return err
			}
			bySeq[id] = seq
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		taken, err := tx.QueryContext(ctx, s.list("in-table", `SELECT id FROM {table} WHERE id IN ({in})`, len(ids)), args(ids)...)
		if err != nil {
			return err
		}
		var dup []int64
		for taken.Next() {
			var id string
			if err := taken.Scan(&id); err != nil {
				taken.Close()
				return err
			}
			dup = append(dup, bySeq[id])
			delete(bySeq, id)
		}
		taken.Close()
		if err := taken.Err(); err != nil {
			return err
		}
		if len(dup) > 0 {
			if _, err := tx.ExecContext(ctx, s.list("refuse", `UPDATE {scheduled} SET refused = TRUE, last_error = ? WHERE seq IN ({in})`, len(dup)),
				args(dup, reason)...); err != nil {
				return err
			}
		}
		seqs := make([]int64, 0, len(bySeq))
		for _, q := range bySeq {
			seqs = append(seqs, q)
		}
		if len(seqs) > 0 {
			if _, err := tx.ExecContext(ctx, s.list("promote", `INSERT INTO {table} (id, event_type, event_key, exchange, routing_key, payload, content_type, headers)
SELECT id, event_type, event_key, exchange, routing_key, payload, content_type, headers FROM {scheduled}
WHERE seq IN ({in}) ORDER BY event_key, due, seq`, len(seqs)), args(seqs)...); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, s.list("promoted", `DELETE FROM {scheduled} WHERE seq IN ({in})`, len(seqs)), args(seqs)...); err != nil {
				return err
			}
		}
		moved, refused = int64(len(seqs)), int64(len(dup))
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	if moved+refused == int64(n) {
		return moved, refused, 0, nil
	}
	next, err = s.nextDue(ctx, db)
	return moved, refused, max(next, 0), err
}

// nextDue says how far from now the next delayed message is due (0 or
// less: due; backend.NoneDue: none).
func (s *Store) nextDue(ctx context.Context, db *sql.DB) (time.Duration, error) {
	var until sql.NullInt64
	if err := db.QueryRowContext(ctx, s.sq.nextDue).Scan(&until); err != nil {
		return 0, err
	}
	if !until.Valid {
		return backend.NoneDue, nil
	}
	return time.Duration(until.Int64) * time.Microsecond, nil
}

// Scheduled implements backend.Backend.
func (s *Store) Scheduled(ctx context.Context, db *sql.DB, limit int64) (int64, time.Duration, bool, error) {
	var (
		n    int64
		next sql.NullInt64
	)
	err := db.QueryRowContext(ctx, s.sq.count, limit).Scan(&n, &next)
	if err != nil {
		return 0, 0, false, err
	}
	return n, time.Duration(next.Int64) * time.Microsecond, next.Valid, nil
}

// ListScheduled implements backend.Backend.
func (s *Store) ListScheduled(ctx context.Context, db *sql.DB, q backend.ScheduledQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, s.sq.list, q.EventType, q.EventType, q.Key, q.Key, q.AfterDue, q.AfterDue, q.AfterID, q.Limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []backend.Row
	for rows.Next() {
		var (
			r            backend.Row
			created, due int64
		)
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &r.Headers,
			&created, &due, &r.LastError); err != nil {
			return nil, err
		}
		r.Seq = 0 // the scheduled table's own, not the outbox table's
		r.CreatedAt, r.Due = fromMicros(created), fromMicros(due)
		out = append(out, r)
	}
	return out, rows.Err()
}

// ChangeScheduled implements backend.Backend.
func (s *Store) ChangeScheduled(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	kind, text := "publish-now", `UPDATE {scheduled} FORCE INDEX (id_idx) SET due = `+now+`, refused = FALSE, last_error = NULL WHERE id IN ({in})`
	if discard {
		kind, text = "discard-scheduled", `DELETE FROM {scheduled} WHERE id IN ({in})`
	}
	var total int64
	for start := 0; start < len(ids); start += idsChunk {
		chunk := ids[start:min(start+idsChunk, len(ids))]
		res, err := db.ExecContext(ctx, s.list(kind, text, len(chunk)), args(chunk)...)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
