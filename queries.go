package outbox

import "strings"

// queries holds the SQL of a Store, built once from its validated table
// name. User data never enters these texts: it travels as bind parameters.
type queries struct {
	claim, markPublished, release, markFailed string
	pending, stats, parked, retry, retryAll   string
	purge, purgeable, gauges                  string
}

const messageColumns = `o.id, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload,
	o.content_type, o.headers, o.created_at, o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at`

func newQueries(t table) queries {
	r := strings.NewReplacer("{table}", t.quoted, "{columns}", messageColumns)
	return queries{
		// One statement. The subquery locks candidate rows for the length
		// of this statement only (SKIP LOCKED lets concurrent claimers pass
		// each other) and the UPDATE decides the claim: a row another
		// claimer took meanwhile fails the re-checked WHERE and is not
		// returned. It is written as id = ANY(ARRAY(...)) rather than a CTE
		// joined to the table so that even a generic plan, cached while the
		// table was small, reaches the rows through the primary key.
		// The window keeps rows, in id order, while the bytes before them
		// stay under the bound ($4), so that a claim never brings more
		// than about that much into memory, and always at least one row.
		// octet_length reads a payload's size from its TOAST header: the
		// payloads left out are never fetched.
		claim: r.Replace(`UPDATE {table} AS o
SET claimed_until = now() + $2::bigint * interval '1 microsecond', claim_token = $3::uuid
WHERE o.id = ANY(ARRAY(
	SELECT id FROM (
		SELECT id, sum(size) OVER (ORDER BY id) - size AS before
		FROM (
			SELECT id, octet_length(payload)::bigint + pg_column_size(headers) AS size
			FROM {table}
			WHERE published_at IS NULL AND parked_at IS NULL
			  AND available_at <= now()
			  AND (claimed_until IS NULL OR claimed_until <= now())
			ORDER BY id
			LIMIT $1
			FOR UPDATE SKIP LOCKED) AS candidates
	) AS sized
	WHERE before < $4))
RETURNING {columns}`),

		// Fenced by the claim token: one statement per claim (a relay
		// settles the messages of one claim together). The id = ANY
		// condition keeps even a generic plan, cached while the table was
		// small, on the primary key.
		markPublished: r.Replace(`UPDATE {table}
SET published_at = now(), claimed_until = NULL, claim_token = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL
RETURNING id`),

		release: r.Replace(`UPDATE {table}
SET claimed_until = NULL, claim_token = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL
RETURNING id`),

		markFailed: r.Replace(`UPDATE {table}
SET attempts = attempts + 1,
    last_error = $3,
    claimed_until = NULL,
    claim_token = NULL,
    available_at = now() + $4::bigint * interval '1 microsecond',
    parked_at = CASE WHEN attempts + 1 >= $5 THEN now() END
WHERE id = $1::uuid AND claim_token = $2::uuid AND published_at IS NULL
RETURNING attempts, parked_at IS NOT NULL`),

		// Two counts, each answered by its own partial index.
		pending: r.Replace(`SELECT
	(SELECT count(*) FROM {table} WHERE published_at IS NULL AND parked_at IS NULL) +
	(SELECT count(*) FROM {table} WHERE published_at IS NULL AND parked_at IS NOT NULL)`),

		stats: r.Replace(`WITH live AS (
	SELECT count(*) AS n,
	       count(*) FILTER (WHERE claimed_until > now()) AS claimed,
	       min(created_at) AS oldest
	FROM {table} WHERE published_at IS NULL AND parked_at IS NULL
), parked AS (
	SELECT count(*) AS n, min(created_at) AS oldest
	FROM {table} WHERE published_at IS NULL AND parked_at IS NOT NULL
)
SELECT live.n + parked.n, live.claimed, parked.n,
       coalesce(extract(epoch FROM now() - least(live.oldest, parked.oldest))::float8, 0),
       (SELECT count(*) FROM {table} WHERE published_at IS NOT NULL AND published_at > now() - interval '1 hour')
FROM live, parked`),

		parked: r.Replace(`SELECT {columns} FROM {table} AS o
WHERE published_at IS NULL AND parked_at IS NOT NULL
ORDER BY parked_at DESC, id
LIMIT $1`),

		retry: r.Replace(`UPDATE {table}
SET parked_at = NULL, attempts = 0, available_at = now()
WHERE id = ANY($1::uuid[]) AND parked_at IS NOT NULL AND published_at IS NULL`),

		retryAll: r.Replace(`UPDATE {table}
SET parked_at = NULL, attempts = 0, available_at = now()
WHERE parked_at IS NOT NULL AND published_at IS NULL`),

		// Each part is answered by a partial index: the claim index
		// (unpublished, unparked rows, by id: the oldest first) and the
		// parked index. The counts stop at $1.
		gauges: r.Replace(`SELECT
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE published_at IS NULL AND parked_at IS NULL LIMIT $1) AS p),
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE published_at IS NULL AND parked_at IS NOT NULL LIMIT $1) AS k),
	coalesce(extract(epoch FROM now() - (
		SELECT created_at FROM {table} WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1))::float8, 0)`),

		purgeable: r.Replace(`SELECT count(*) FROM {table}
WHERE published_at IS NOT NULL AND published_at < now() - $1::bigint * interval '1 microsecond'`),

		purge: r.Replace(`DELETE FROM {table} WHERE id IN (
	SELECT id FROM {table}
	WHERE published_at IS NOT NULL AND published_at < $1
	ORDER BY published_at
	LIMIT $2
)`),
	}
}
