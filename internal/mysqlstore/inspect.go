package mysqlstore

import (
	"context"
	"database/sql"

	"github.com/acemq/outbox/internal/backend"
)

// inspectQueries are the statements of backend.Inspector.
type inspectQueries struct {
	leases, blockedKeys, keyQueue, publishedByMinute, held string
}

func newInspectQueries(table string) inspectQueries {
	r := func(q string) string { return replace(table, q) }
	return inspectQueries{
		// The waiting entries of state_idx.
		leases: r(`SELECT claim_token, count(*), ` + micros("max(claimed_until)") + ` FROM {table} FORCE INDEX (state_idx)
WHERE {waiting} AND {in_flight} AND claim_token IS NOT NULL
GROUP BY claim_token ORDER BY max(claimed_until) LIMIT ?`),
		// The parked entries of state_idx, then key_idx for the held
		// messages of each key.
		blockedKeys: r(`SELECT p.event_key, count(*), ` + micros("min(p.parked_at)") + `,
	(SELECT count(*) FROM {table} AS h FORCE INDEX (key_idx)
	 WHERE h.event_key = p.event_key AND h.published_at IS NULL AND h.parked_at IS NULL AND h.held)
FROM {table} AS p FORCE INDEX (state_idx) WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL AND p.event_key <> ''
GROUP BY p.event_key ORDER BY min(p.parked_at) LIMIT ?`),
		// key_idx, in the key's order (ord on an ordered table, then seq).
		keyQueue: r(`SELECT {columns}, CASE
	WHEN parked_at IS NOT NULL THEN 'parked'
	WHEN held THEN 'held'
	WHEN {in_flight} THEN 'in flight'
	WHEN available_at > {now} THEN 'retrying'
	ELSE 'ready' END
FROM {table} FORCE INDEX (key_idx) WHERE event_key = ? AND published_at IS NULL AND event_key <> ''
ORDER BY ord, seq LIMIT ?`),
		// The held entries of state_idx, in the order of seq.
		held: r(`SELECT {columns} FROM {table} FORCE INDEX (state_idx)
WHERE {held} AND (? = '' OR event_type = ?) AND (? = '' OR event_key = ?)
  AND (? = 0 OR created_at <= TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND) AND seq > ?
ORDER BY seq LIMIT ?`),
		// The published entries of state_idx, from a minute boundary.
		publishedByMinute: r(`SELECT FLOOR(TIMESTAMPDIFF(SECOND, published_at, {now}) / 60), count(*) FROM {table} FORCE INDEX (state_idx)
WHERE published_at > {now} - INTERVAL ? MINUTE AND discarded_at IS NULL
GROUP BY 1`),
	}
}

// Leases implements backend.Inspector.
func (s *Store) Leases(ctx context.Context, db *sql.DB, limit int) ([]backend.Lease, error) {
	rows, err := db.QueryContext(ctx, s.ins.leases, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []backend.Lease
	for rows.Next() {
		var (
			l     backend.Lease
			until int64
		)
		if err := rows.Scan(&l.Claim, &l.Messages, &until); err != nil {
			return nil, err
		}
		l.Until = fromMicros(until)
		out = append(out, l)
	}
	return out, rows.Err()
}

// BlockedKeys implements backend.Inspector.
func (s *Store) BlockedKeys(ctx context.Context, db *sql.DB, limit int) ([]backend.BlockedKey, error) {
	rows, err := db.QueryContext(ctx, s.ins.blockedKeys, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []backend.BlockedKey
	for rows.Next() {
		var (
			k     backend.BlockedKey
			since int64
		)
		if err := rows.Scan(&k.Key, &k.Parked, &since, &k.Held); err != nil {
			return nil, err
		}
		k.Since = fromMicros(since)
		out = append(out, k)
	}
	return out, rows.Err()
}

// KeyQueue implements backend.Inspector.
func (s *Store) KeyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, s.ins.keyQueue, key, limit)
	if err != nil {
		return nil, err
	}
	return scanRows(rows, func(r *backend.Row) []any { return []any{&r.State} })
}

// PublishedByMinute implements backend.Inspector.
func (s *Store) PublishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error) {
	rows, err := db.QueryContext(ctx, s.ins.publishedByMinute, minutes)
	if err != nil {
		return nil, err
	}
	return backend.ScanMinutes(rows, minutes)
}

// Held implements backend.Inspector.
func (s *Store) Held(ctx context.Context, db *sql.DB, q backend.HeldQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, s.ins.held, q.EventType, q.EventType, q.Key, q.Key, q.CreatedBefore, q.CreatedBefore, q.AfterSeq, q.Limit)
	if err != nil {
		return nil, err
	}
	return scanRows(rows)
}
