package pglog

import (
	"context"
	"database/sql"
	"strings"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgsql"
)

// The inspections (backend.Inspector): the batch and settle tables for
// the live claims and the published history, the failed table for the
// blocked keys and a key's queue.

// inspections builds the inspections' statements with r.
func (q *statements) inspections(r *strings.Replacer) {
	// The latest gen of each batch with something unsettled and its lease
	// live, and the claims of failed messages.
	q.leases = r.Replace(`SELECT * FROM (
	SELECT 'batch ' || u.batch_id || ', gen ' || u.gen, u.remaining::bigint, u.lease_until FROM ` + unsettledFrom + `
	WHERE u.remaining > 0 AND u.taken
	UNION ALL
	SELECT 'failed ' || claim_token::text, count(*), max(claimed_until) FROM {failed}
	WHERE published_at IS NULL AND discarded_at IS NULL AND ` + failedInFlight + ` AND claim_token IS NOT NULL
	GROUP BY claim_token) AS l
ORDER BY 3 LIMIT $1`)
	q.blockedKeys = r.Replace(`SELECT event_key, count(*) FILTER (WHERE parked_at IS NOT NULL), min(parked_at),
	count(*) FILTER (WHERE ` + failedHeld + `)
FROM {failed} WHERE published_at IS NULL AND discarded_at IS NULL AND event_key <> ''
GROUP BY event_key HAVING count(*) FILTER (WHERE parked_at IS NOT NULL) > 0
ORDER BY min(parked_at) LIMIT $1`)
	q.keyQueue = r.Replace(`SELECT o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
	o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at, CASE
	WHEN o.parked_at IS NOT NULL THEN 'parked'
	WHEN o.claimed_until > now() THEN 'in flight'
	WHEN o.last_error IS NULL THEN 'held'
	WHEN o.available_at > now() THEN 'retrying'
	ELSE 'ready' END
FROM {failed} AS o WHERE o.event_key = $1 AND o.published_at IS NULL AND o.discarded_at IS NULL
ORDER BY coalesce(o.ord, 0), o.seq LIMIT $2`)
	q.held = r.Replace(`SELECT id, seq, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, coalesce(last_error, ''), claimed_until, parked_at
FROM {failed} WHERE published_at IS NULL AND discarded_at IS NULL AND ` + failedHeld + `
  AND ($2 = '' OR event_type = $2) AND ($3 = '' OR event_key = $3)
  AND ($4::bigint = 0 OR created_at <= to_timestamp(0) + $4::bigint * interval '1 microsecond') AND seq > $5
ORDER BY seq LIMIT $1`)
	q.byMinute = r.Replace(`SELECT floor(extract(epoch FROM now() - at) / 60)::int, sum(cardinality(seqs))::bigint FROM {settle}
WHERE kind = 'p' AND at > now() - $1::int * interval '1 minute' GROUP BY 1
UNION ALL
SELECT floor(extract(epoch FROM now() - published_at) / 60)::int, count(*) FROM {failed}
WHERE published_at > now() - $1::int * interval '1 minute' AND discarded_at IS NULL GROUP BY 1`)
}

// Leases lists the live claims: batches and claims of the failed table.
func (b *Backend) Leases(ctx context.Context, db *sql.DB, limit int) ([]backend.Lease, error) {
	rows, err := db.QueryContext(ctx, b.q.leases, limit)
	if err != nil {
		return nil, err
	}
	return backend.ScanLeases(rows)
}

func (b *Backend) BlockedKeys(ctx context.Context, db *sql.DB, limit int) ([]backend.BlockedKey, error) {
	rows, err := db.QueryContext(ctx, b.q.blockedKeys, limit)
	if err != nil {
		return nil, err
	}
	return backend.ScanBlockedKeys(rows)
}

// KeyQueue lists what of key failed or waits behind a failure: the events
// table has no index by key.
func (b *Backend) KeyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.q.keyQueue, key, limit)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil, func(r *backend.Row) []any { return []any{&r.State} })
}

func (b *Backend) PublishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error) {
	rows, err := db.QueryContext(ctx, b.q.byMinute, minutes)
	if err != nil {
		return nil, err
	}
	return backend.ScanMinutes(rows, minutes)
}

func (b *Backend) Held(ctx context.Context, db *sql.DB, q backend.HeldQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.q.held, q.Limit, q.EventType, q.Key, q.CreatedBefore, q.AfterSeq)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil)
}
