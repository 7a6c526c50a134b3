package pgrows

import (
	"context"
	"database/sql"
	"strings"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgsql"
)

// inspectQueries are the statements of backend.Inspector.
type inspectQueries struct {
	leases, blockedKeys, keyQueue, publishedByMinute, held string
}

func newInspectQueries(t Table) inspectQueries {
	r := strings.NewReplacer("{table}", t.Quoted, "{columns}", messageColumns, "{waiting}", waiting, "{held}", held, "{parked}", parked,
		"{ready}", ready, "{in_flight}", inFlight, "{retrying}", retrying)
	return inspectQueries{
		// Claimed messages are waiting ones: the claim index finds them.
		leases: r.Replace(`SELECT claim_token::text, count(*), max(claimed_until) FROM {table}
WHERE {waiting} AND {in_flight} AND claim_token IS NOT NULL
GROUP BY claim_token ORDER BY max(claimed_until) LIMIT $1`),
		// The parked index, then the held index by key.
		blockedKeys: r.Replace(`SELECT p.event_key, count(*), min(p.parked_at),
	(SELECT count(*) FROM {table} AS h WHERE h.event_key = p.event_key AND h.held AND h.published_at IS NULL AND h.parked_at IS NULL)
FROM {table} AS p WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL AND p.event_key <> ''
GROUP BY p.event_key ORDER BY min(p.parked_at) LIMIT $1`),
		// The key index, in the order of seq.
		keyQueue: r.Replace(`SELECT {columns}, CASE
	WHEN o.parked_at IS NOT NULL THEN 'parked'
	WHEN o.held THEN 'held'
	WHEN o.claimed_until > now() THEN 'in flight'
	WHEN o.available_at > now() THEN 'retrying'
	ELSE 'ready' END
FROM {table} AS o WHERE o.event_key = $1 AND o.published_at IS NULL AND o.event_key <> ''
ORDER BY o.seq LIMIT $2`),
		// The held index; the held messages of a blocked table are few.
		held: r.Replace(`SELECT {columns} FROM {table} AS o
WHERE o.held AND o.published_at IS NULL AND o.parked_at IS NULL
  AND ($2 = '' OR o.event_type = $2) AND ($3 = '' OR o.event_key = $3)
  AND ($4::bigint = 0 OR o.created_at <= to_timestamp(0) + $4::bigint * interval '1 microsecond') AND o.seq > $5
ORDER BY o.seq LIMIT $1`),
		// The published index, from a minute boundary by the database's
		// clock; discarded messages are not published.
		publishedByMinute: r.Replace(`SELECT floor(extract(epoch FROM now() - published_at) / 60)::int, count(*) FROM {table}
WHERE published_at IS NOT NULL AND published_at > now() - $1::int * interval '1 minute' AND discarded_at IS NULL
GROUP BY 1`),
	}
}

// Leases implements backend.Inspector.
func (b *Backend) Leases(ctx context.Context, db *sql.DB, limit int) ([]backend.Lease, error) {
	rows, err := db.QueryContext(ctx, b.ins.leases, limit)
	if err != nil {
		return nil, err
	}
	return backend.ScanLeases(rows)
}

// BlockedKeys implements backend.Inspector.
func (b *Backend) BlockedKeys(ctx context.Context, db *sql.DB, limit int) ([]backend.BlockedKey, error) {
	rows, err := db.QueryContext(ctx, b.ins.blockedKeys, limit)
	if err != nil {
		return nil, err
	}
	return backend.ScanBlockedKeys(rows)
}

// KeyQueue implements backend.Inspector.
func (b *Backend) KeyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.ins.keyQueue, key, limit)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil, func(r *backend.Row) []any { return []any{&r.State} })
}

// PublishedByMinute implements backend.Inspector.
func (b *Backend) PublishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error) {
	rows, err := db.QueryContext(ctx, b.ins.publishedByMinute, minutes)
	if err != nil {
		return nil, err
	}
	return backend.ScanMinutes(rows, minutes)
}

// Held implements backend.Inspector.
func (b *Backend) Held(ctx context.Context, db *sql.DB, q backend.HeldQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.ins.held, q.Limit, q.EventType, q.Key, q.CreatedBefore, q.AfterSeq)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil)
}
