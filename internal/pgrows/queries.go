package pgrows

import (
	"strings"

	"github.com/acemq/outbox/internal/pgsql"
)

// queries holds the SQL of a table in one mode, built once from its
// validated name. User data never enters these texts: it travels as bind
// parameters.
type queries struct {
	claim, markPublished, release, markFailed string
	releaseClaim                              string // GiveBack
	pending, stats, parked, retry, retryAll   string
	purge, purgeable, gauges, discard         string
	hold, unhold                              string
}

const messageColumns = `o.id, coalesce(o.seq, 0), o.event_type, o.event_key, o.exchange, o.routing_key, o.payload,
	o.content_type, o.headers, o.created_at, o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at`

// A waiting message is in exactly one of three partial indexes: the claim
// index (neither parked nor held), the held index, the parked index. The
// counts below add them up, each from its own index.
const (
	waiting = `published_at IS NULL AND parked_at IS NULL AND NOT held`
	held    = `held AND published_at IS NULL AND parked_at IS NULL`
	parked  = `published_at IS NULL AND parked_at IS NOT NULL`
)

// A waiting message (above) is in exactly one of three states: ready (a
// relay may claim it now), in flight (claimed, its lease not expired) or
// retrying (waiting out a backoff).
const (
	ready    = `available_at <= now() AND (claimed_until IS NULL OR claimed_until <= now())`
	inFlight = `claimed_until > now()`
	retrying = `available_at > now() AND (claimed_until IS NULL OR claimed_until <= now())`
)

// unheldCTE, appended to a statement whose CTE "changed" returns the
// event_key of the messages it published, re-armed or discarded, brings
// back the held messages of those keys: the message that blocked them is
// out of the way. Rows another statement has locked (a relay releasing
// them) are skipped rather than waited for, so that two settles never
// deadlock over them; Store.Reconcile brings those back.
const unheldCTE = `, unheld AS (
	UPDATE {table} SET held = false
	WHERE id IN (
		SELECT id FROM {table}
		WHERE {held} AND event_key IN (SELECT event_key FROM changed WHERE event_key <> '')
		  AND id NOT IN (SELECT id FROM changed)
		FOR UPDATE SKIP LOCKED)
)`

// heldKeys lists the keys that have held messages, one index probe per key
// (a loose index scan: the held index has many rows of few keys).
const heldKeys = `RECURSIVE held_keys AS (
	(SELECT event_key FROM {table} WHERE {held} ORDER BY event_key LIMIT 1)
	UNION ALL
	SELECT (SELECT event_key FROM {table} WHERE {held} AND event_key > k.event_key ORDER BY event_key LIMIT 1)
	FROM held_keys AS k WHERE k.event_key IS NOT NULL
)`

// headOf is the first unpublished message of the key of the row named
// outer: the one ordered mode publishes next (one probe of the key index).
func headOf(outer string) string {
	return `(SELECT h.id, h.seq, h.held, h.parked_at, h.attempts, h.available_at, h.claimed_until FROM {table} AS h
	WHERE h.event_key = ` + outer + `.event_key AND h.published_at IS NULL AND h.event_key <> ''
	ORDER BY h.seq LIMIT 1)`
}

// changing is a statement that changes parked messages (set, where) and
// brings back the messages held behind them, and returns how many it
// changed: Retry, RetryAllParked, Discard.
func changing(set, where string) string {
	return `WITH changed AS (
	UPDATE {table}
	SET ` + set + `
	WHERE ` + where + `
	RETURNING id, event_key
){unheld}
SELECT count(*) FROM changed`
}

// failing says that the head has failed and is not published yet: it is
// parked, backing off, or ready to be tried again. Its key's later messages
// stay held until it is published, re-armed or discarded, rather than come
// back and be held again at every attempt.
const failing = `NOT head.held AND (head.parked_at IS NOT NULL OR head.attempts > 0)`

func newQueries(t Table, ordered bool) queries {
	// The fragments that hold placeholders are filled first; each
	// statement is then filled once, and TestStatementsHaveNoPlaceholderLeft
	// looks for a placeholder left in any.
	frag := strings.NewReplacer("{table}", t.Quoted, "{held}", held)
	r := strings.NewReplacer("{table}", t.Quoted, "{ordered_now}", t.OrderedNow, "{columns}", messageColumns, "{waiting}", waiting, "{held}", held, "{parked}", parked,
		"{ready}", ready, "{in_flight}", inFlight, "{retrying}", retrying,
		"{unheld}", frag.Replace(unheldCTE), "{held_keys}", frag.Replace(heldKeys), "{failing}", failing,
		"{async}", pgsql.AsyncCondition)
	fill := r.Replace
	q := queries{
		claim: fill(claimSQL),

		// Fenced by the claim token: one statement per claim (a relay
		// settles the messages of one claim together). Claims, marks and
		// releases commit asynchronously ({async}, see pgsql.AsyncCommit): a
		// crash of the server that loses one costs duplicates, never a
		// message; failures commit as every write does. The id = ANY
		// condition keeps even a generic plan, cached while the table was
		// small, on the primary key.
		markPublished: fill(`UPDATE {table}
SET published_at = now(), claimed_until = NULL, claim_token = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL AND {async}
RETURNING id`),

		release: fill(`UPDATE {table}
SET claimed_until = NULL, claim_token = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL AND {async}
RETURNING id`),

		// A claim that failed gives back what its token took (see
		// Backend.GiveBack). Claimed messages are waiting ones: the claim
		// index finds them.
		releaseClaim: fill(`UPDATE {table}
SET claimed_until = NULL, claim_token = NULL
WHERE {waiting} AND claim_token = $1::uuid`),

		markFailed: fill(markFailedSQL + `
RETURNING attempts, parked_at IS NOT NULL`),

		// Pending means one thing everywhere (Store.Pending, Stats,
		// Gauges, the metrics, outbox status): waiting to be published,
		// ready, claimed, backing off, held and parked ones, all of them.
		pending: fill(`SELECT
	(SELECT count(*) FROM {table} WHERE {waiting}) +
	(SELECT count(*) FROM {table} WHERE {held}) +
	(SELECT count(*) FROM {table} WHERE {parked})`),

		// Ready, in flight, retrying, held, parked (their sum is Pending),
		// the ages of the oldest pending and of the oldest ready message.
		stats: fill(`WITH live AS (
	SELECT count(*) FILTER (WHERE {ready}) AS ready,
	       count(*) FILTER (WHERE {in_flight}) AS in_flight,
	       count(*) FILTER (WHERE {retrying}) AS retrying,
	       min(created_at) AS oldest,
	       min(created_at) FILTER (WHERE {ready}) AS oldest_ready
	FROM {table} WHERE {waiting}
), held AS (
	SELECT count(*) AS n, min(created_at) AS oldest FROM {table} WHERE {held}
), parked AS (
	SELECT count(*) AS n, min(created_at) AS oldest FROM {table} WHERE {parked}
)
SELECT live.ready, live.in_flight, live.retrying, held.n, parked.n,
       coalesce(extract(epoch FROM now() - least(live.oldest, held.oldest, parked.oldest))::float8, 0),
       coalesce(extract(epoch FROM now() - live.oldest_ready)::float8, 0),
       (SELECT count(*) FROM {table} WHERE published_at IS NOT NULL AND published_at > now() - interval '1 hour' AND discarded_at IS NULL),
       (SELECT count(DISTINCT event_key) FROM {table} WHERE {parked} AND event_key <> '')
FROM live, held, parked`),

		parked: fill(`SELECT {columns} FROM {table} AS o
WHERE {parked}` + pgsql.ParkedFilter + `
ORDER BY o.parked_at DESC, coalesce(o.seq, 0) DESC
LIMIT $1`),

		// Re-arming or discarding a parked message brings back the
		// messages held behind it.
		retry:    fill(changing(rearm, `id = ANY($1::uuid[]) AND {parked}`)),
		retryAll: fill(changing(rearm, `{parked}`)),

		// Only parked messages can be given up on. The row stays, with its
		// attempts and last error; published_at takes it out of the
		// outbox's work (and, in ordered mode, unblocks its key) and lets
		// it be purged with the published history.
		discard: fill(changing(`published_at = now(), discarded_at = now()`, `id = ANY($1::uuid[]) AND {parked}`)),

		// Each part is answered by a partial index. The counts stop at $1.
		// Pending is their sum, added up by Gauges.
		gauges: fill(`SELECT
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {waiting} AND {ready} LIMIT $1) AS r),
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {waiting} AND {in_flight} LIMIT $1) AS f),
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {waiting} AND {retrying} LIMIT $1) AS d),
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {held} LIMIT $1) AS h),
	(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {parked} LIMIT $1) AS k),
	coalesce(extract(epoch FROM now() - least(
		(SELECT created_at FROM {table} WHERE {waiting} ORDER BY seq LIMIT 1),
		(SELECT created_at FROM {table} WHERE {held} ORDER BY seq LIMIT 1),
		(SELECT min(created_at) FROM {table} WHERE {parked})))::float8, 0),
	coalesce(extract(epoch FROM now() - (SELECT created_at FROM {table} WHERE {waiting} AND {ready} ORDER BY seq LIMIT 1))::float8, 0),
	(SELECT count(*) FROM (SELECT DISTINCT event_key FROM (SELECT event_key FROM {table} WHERE {parked} AND event_key <> '' LIMIT $1) AS e) AS b)`),

		purgeable: fill(`SELECT count(*) FROM {table}
WHERE published_at IS NOT NULL AND published_at < now() - $1::bigint * interval '1 microsecond'`),

		purge: fill(`DELETE FROM {table} WHERE id IN (
	SELECT id FROM {table}
	WHERE published_at IS NOT NULL AND published_at < $1
	ORDER BY published_at
	LIMIT $2
)`),

		// Ordered mode, Store.Reconcile: hold the waiting messages of keys
		// whose head has failed, found among the keys with held or parked
		// messages, and only messages written after the last held one.
		// The head is locked FOR SHARE: a head published, re-armed or
		// discarded meanwhile is re-read and no longer counts; one changed
		// after this commits brings the messages back, or, if its statement
		// began before this committed, the next unhold does. Every lock is
		// taken SKIP LOCKED, so that Reconcile never waits for a relay's
		// marks or claims, and can never be part of a deadlock with them:
		// what it skips, a later round takes. (Unqualified columns are
		// those of the innermost table that has them.)
		hold: fill(`WITH {held_keys}, keys AS (
	SELECT event_key FROM held_keys WHERE event_key IS NOT NULL
	UNION
	SELECT DISTINCT event_key FROM {table} WHERE {parked} AND event_key <> ''
), failing AS (
	SELECT f.event_key, f.seq FROM {table} AS f
	WHERE f.id IN (SELECT head.id FROM keys AS k0, LATERAL ` + headOf("k0") + ` AS head WHERE {failing})
	  AND f.published_at IS NULL AND NOT f.held AND (f.parked_at IS NOT NULL OR f.attempts > 0)
	FOR SHARE OF f SKIP LOCKED
), targets AS (
	SELECT r.id FROM {table} AS r
	JOIN failing ON r.event_key = failing.event_key
	WHERE r.event_key <> '' AND {waiting}
	  AND r.seq > greatest(failing.seq, (SELECT max(l.seq) FROM {table} AS l WHERE l.event_key = failing.event_key AND {held}))
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE {table} SET held = true WHERE id IN (SELECT id FROM targets)`),

		// Ordered mode, Store.Reconcile: bring back the held messages of
		// keys whose head has not failed (a bring-back that was missed),
		// SKIP LOCKED like the hold.
		unhold: fill(`WITH {held_keys}, free AS MATERIALIZED (
	SELECT k0.event_key FROM held_keys AS k0
	WHERE k0.event_key IS NOT NULL
	  AND NOT EXISTS (SELECT 1 FROM ` + headOf("k0") + ` AS head WHERE {failing})
), targets AS (
	SELECT r.id FROM {table} AS r
	JOIN free ON r.event_key = free.event_key
	WHERE {held}
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE {table} SET held = false WHERE id IN (SELECT id FROM targets)`),
	}
	if !ordered {
		// Nothing is held in unordered mode (Reconcile does not hold):
		// what an ordered relay held before the table changed modes comes
		// back.
		q.unhold = fill(`UPDATE {table} SET held = false WHERE id IN (SELECT id FROM {table} WHERE {held} FOR UPDATE SKIP LOCKED)`)
	}
	if ordered {
		q.claim = fill(orderedClaimSQL)
		// A message published brings back the messages held behind it.
		q.markPublished = fill(`WITH changed AS (
	UPDATE {table}
	SET published_at = now(), claimed_until = NULL, claim_token = NULL
	WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL AND {async}
	RETURNING id, event_key
){unheld}
SELECT id FROM changed`)
		// A message that failed holds the later messages of its key (SKIP
		// LOCKED, like the bring-back: Store.Reconcile holds what it skips).
		q.markFailed = fill(`WITH failed AS (` + markFailedSQL + `
RETURNING attempts, parked_at IS NOT NULL AS parked, event_key, seq
), holding AS (
	UPDATE {table} SET held = true
	WHERE id IN (
		SELECT r.id FROM {table} AS r, failed
		WHERE failed.event_key <> '' AND r.event_key = failed.event_key AND r.event_key <> '' AND r.seq > failed.seq AND {waiting}
		FOR UPDATE OF r SKIP LOCKED)
)
SELECT attempts, parked FROM failed`)
	}
	return q
}

// rearm is what Retry does to a parked message.
const rearm = `parked_at = NULL, attempts = 0, available_at = now()`

// markFailedSQL counts a failed attempt, fenced by the claim token, and
// parks the message at the last one.
const markFailedSQL = `UPDATE {table}
SET attempts = attempts + 1,
    last_error = $3,
    claimed_until = NULL,
    claim_token = NULL,
    available_at = now() + $4::bigint * interval '1 microsecond',
    parked_at = CASE WHEN attempts + 1 >= $5 THEN now() END
WHERE id = $1::uuid AND claim_token = $2::uuid AND published_at IS NULL`

// claimSQL is the claim of the unordered mode. One statement. The subquery
// locks candidate rows for the length of this statement only (SKIP LOCKED
// lets concurrent claimers pass each other) and the UPDATE decides the
// claim. It is written as id = ANY(ARRAY(...)) rather than a CTE joined to
// the table so that even a generic plan, cached while the table was small,
// reaches the rows through the primary key. The window keeps rows, in the
// order of seq, while the bytes before them stay under the bound ($4), so
// that a claim never brings more than about that much into memory, and
// always at least one row. octet_length reads a payload's size from its
// TOAST header: the payloads left out are never fetched. On a table made
// ordered since the store last read its mode it takes no message with a
// key ({ordered_now}, evaluated once per statement): those are claimed in
// order, by ordered mode's claim, once the store has read the new mode.
const claimSQL = `UPDATE {table} AS o
SET claimed_until = now() + $2::bigint * interval '1 microsecond', claim_token = $3::uuid
WHERE o.id = ANY(ARRAY(
	SELECT id FROM (
		SELECT id, sum(size) OVER (ORDER BY seq) - size AS before
		FROM (
			SELECT id, seq, octet_length(payload)::bigint + pg_column_size(headers) AS size
			FROM {table}
			WHERE {waiting}
			  AND available_at <= now()
			  AND (claimed_until IS NULL OR claimed_until <= now())
			  AND (event_key = '' OR NOT {ordered_now})
			ORDER BY seq
			LIMIT $1
			FOR UPDATE SKIP LOCKED) AS candidates
	) AS sized
	WHERE before < $4))
  AND {async}
RETURNING {columns}`

// orderedClaimSQL is the claim of ordered mode: the unordered claim, where
// a message of a key is claimed only with every unpublished message of its
// key written before it. Three steps:
//
//  1. candidates: ready rows (neither parked nor held, not backing off, not
//     claimed) in the order of seq, locked (SKIP LOCKED), of which a key's
//     row is left out without being locked when the key's first unpublished
//     message (its head: one probe of the key index) is another one that is
//     parked, backing off or claimed;
//  2. gaps: for each key among the candidates, the first unpublished row
//     of the key that is not a candidate (skipped because locked, or not
//     ready), by the statement's snapshot;
//  3. a candidate is claimed only below its key's gap, then the byte window.
//
// Each step is linear in the rows it reads: the candidates by the claim
// index, one probe of the key index each; the gaps by the key index over
// the candidates' keys (the unpublished rows of each key up to its last
// candidate), less the candidates: a set difference, which PostgreSQL
// computes by hashing or sorting under any plan, where an anti-join may
// become a nested loop over the candidates under a generic plan; step 3 in
// one more. A claim of one key is as linear as one of many (issue 21: the
// gaps were a search of the candidates per row, 15 s for 20,000 rows of
// one key).
//
// Step 3 is what guarantees order, whatever concurrent claimers do: every
// unpublished message of the key written before a claimed one is claimed by
// the same statement. A row that is unpublished now was unpublished in the
// snapshot (nothing is ever unpublished), and a row of the key written
// before a visible one committed before it (Store.Add makes writers of a key
// take turns), so it is visible too. Step 1 only keeps the rows of keys in
// flight from being locked and from filling the LIMIT; the rows of blocked
// keys are held, out of the claim index (see Store.Reconcile).
var orderedClaimSQL = `UPDATE {table} AS o
SET claimed_until = now() + $2::bigint * interval '1 microsecond', claim_token = $3::uuid
WHERE o.id = ANY(ARRAY(
	WITH candidates AS MATERIALIZED (
		SELECT c.id, c.event_key, c.seq, octet_length(c.payload)::bigint + pg_column_size(c.headers) AS size
		FROM {table} AS c
		WHERE c.published_at IS NULL AND c.parked_at IS NULL AND NOT c.held
		  AND c.available_at <= now()
		  AND (c.claimed_until IS NULL OR c.claimed_until <= now())
		  AND (c.event_key = '' OR NOT EXISTS (
			SELECT 1 FROM ` + headOf("c") + ` AS head
			WHERE head.id <> c.id
			  AND (head.parked_at IS NOT NULL OR head.available_at > now() OR head.claimed_until > now())))
		ORDER BY c.seq
		LIMIT $1
		FOR UPDATE OF c SKIP LOCKED
	), gaps AS MATERIALIZED (
		SELECT event_key, min(seq) AS gap FROM (
			SELECT p.event_key, p.seq
			FROM (SELECT event_key, max(seq) AS last FROM candidates WHERE event_key <> '' GROUP BY event_key) AS k
			JOIN {table} AS p ON p.event_key = k.event_key AND p.event_key <> '' AND p.published_at IS NULL AND p.seq < k.last
			EXCEPT
			SELECT event_key, seq FROM candidates) AS missing
		GROUP BY event_key
	)
	SELECT id FROM (
		SELECT id, sum(size) OVER (ORDER BY seq) - size AS before
		FROM candidates AS k
		WHERE NOT EXISTS (SELECT 1 FROM gaps AS g WHERE g.event_key = k.event_key AND g.gap < k.seq)
	) AS sized
	WHERE before < $4))
  AND {async}
RETURNING {columns}`
