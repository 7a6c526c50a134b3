package pglog

import (
	"fmt"
	"strings"

	"github.com/acemq/outbox/internal/pgsql"
)

// statements are a Backend's SQL, built once by New.
type statements struct {
	claim, reclaim, reclaimOrd, unfinished        string
	settle, settleFailed, releaseFailedIDs        string
	failedClaim, failedClaimOrd, divert           string
	failedDue                                     string
	fail, refail, parkUnfit                       string
	releaseBatch, releaseFailed                   string // give-backs
	insertBatch, latestBatch, lockClaims          string
	counts, parked, retry, retryAll               string
	discard, discardAll, horizon, purgeFailed     string
	rotation, sequence                            string
	leases, blockedKeys, keyQueue, byMinute, held string
}

// Columns is what the statements that return messages read of the events
// table o, before their own.
const columns = `o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at`

// Replacer fills the placeholders of the statements of t; Placeholders
// lists them, for the test that looks for one left unfilled.
func replacer(t Table) *strings.Replacer {
	return strings.NewReplacer("{table}", t.Quoted, "{batch}", t.Batch, "{settle}", t.Settle, "{failed}", t.Failed, "{columns}", columns,
		"{blocked}", blocked(t), "{ordered}", t.OrderedNow, "{chunk}", fmt.Sprint(t.Chunk), "{parts}", fmt.Sprint(t.Parts))
}

func newStatements(t Table) statements {
	r := replacer(t)
	var q statements
	q.claim = `SELECT * FROM ` + t.ClaimFn + `($1, $2, $3, $4::uuid, $5)`
	q.rotation = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END, (SELECT max(batch_id) FROM ` + t.Batch + `) FROM ` + t.Seq
	q.sequence = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ` + t.Seq
	q.latestBatch = `SELECT coalesce(max(batch_id), 0) FROM ` + t.Batch
	q.lockClaims = `SELECT pg_advisory_xact_lock(hashtextextended('` + strings.ReplaceAll(t.LockKey, "'", "''") + `', 0))`
	q.releaseBatch, q.releaseFailed = r.Replace(releaseBatchSQL), r.Replace(releaseFailedSQL)
	q.counts, q.parked, q.horizon, q.purgeFailed = r.Replace(countsSQL), r.Replace(parkedSQL), r.Replace(horizonSQL), r.Replace(purgeFailedSQL)
	q.retry, q.retryAll = r.Replace(changeParked(retrySet, true)), r.Replace(changeParked(retrySet, false))
	q.discard, q.discardAll = r.Replace(changeParked(`discarded_at = now()`, true)), r.Replace(changeParked(`discarded_at = now()`, false))
	q.inspections(r)
	// What became of messages $4 of gen $2 of batch $1 (kind $3), claimed
	// under token $5, unless a later gen took the batch over.
	q.settle = r.Replace(`INSERT INTO {settle} (batch_id, gen, kind, seqs)
SELECT $1, $2, $3::"char", $4::bigint[] WHERE ` + pgsql.AsyncCondition + ` AND ` + ownBatch("$5"))
	// Messages $1 of the failed table published (or released: releaseFailedIDs)
	// under claim $2.
	q.settleFailed = r.Replace(`UPDATE {failed} SET published_at = now(), claim_token = NULL, claimed_until = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL RETURNING id`)
	q.releaseFailedIDs = r.Replace(`UPDATE {failed} SET claim_token = NULL, claimed_until = NULL
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL RETURNING id`)
	// A failed attempt at message $4 (seq $3) of gen $2 of batch $1,
	// claimed under token $8: the batch records it as failed, and the
	// message is copied from the events table to the failed table (or,
	// there already, counted again), to back off ($6) and park at
	// MaxAttempts ($7). Nothing is recorded unless the event is read: a
	// failure recorded without its copy would lose the message.
	q.fail = r.Replace(`WITH e AS (
	SELECT ` + columns + `, o.ord FROM {table} AS o
	WHERE o.id = $4::uuid AND o.seq = $3 AND ((o.seq / {chunk}) % {parts}) = (($3::bigint / {chunk}) % {parts})
), s AS (
	INSERT INTO {settle} (batch_id, gen, kind, seqs)
	SELECT $1, $2, 'f', ARRAY[$3::bigint] WHERE EXISTS (SELECT 1 FROM e) AND ` + ownBatch("$8") + `
	RETURNING 1
)
INSERT INTO {failed} AS f (id, seq, ord, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, last_error, available_at, parked_at)
SELECT e.id, e.seq, e.ord, e.event_type, e.event_key, e.exchange, e.routing_key, e.payload, e.content_type, e.headers, e.created_at,
	1, $5, now() + $6::bigint * interval '1 microsecond', CASE WHEN $7 <= 1 THEN now() END
FROM s, e
ON CONFLICT (id) DO UPDATE SET attempts = f.attempts + 1, last_error = excluded.last_error, available_at = excluded.available_at,
	parked_at = CASE WHEN f.attempts + 1 >= $7 THEN now() END, claim_token = NULL, claimed_until = NULL
RETURNING attempts, parked_at IS NOT NULL`)
	// A failed attempt at message $1 taken from the failed table under
	// claim $2: it backs off ($4) and parks at MaxAttempts ($5).
	q.refail = r.Replace(`UPDATE {failed} SET attempts = attempts + 1, last_error = $3,
	available_at = now() + $4::bigint * interval '1 microsecond', claim_token = NULL, claimed_until = NULL,
	parked_at = CASE WHEN attempts + 1 >= $5 THEN now() END
WHERE id = $1 AND claim_token = $2::uuid AND published_at IS NULL
RETURNING attempts, parked_at IS NOT NULL`)
	// The messages of batch $1 that no gen published or failed, with
	// whether their key is blocked: it has a message in the failed table,
	// or another unfinished batch (from $8 on) holds it. The window's
	// transactions begin at xmin(lo).
	q.reclaim = r.Replace(`WITH ` + InflightCTE("$8", "$1") + `
SELECT {columns}, 0, '', NULL::timestamptz, NULL::timestamptz, o.ord, {blocked} FROM {table} AS o, inflight AS i
WHERE (o.tx = ANY(ARRAY(SELECT pg_snapshot_xip($2::pg_snapshot))) OR (o.tx >= pg_snapshot_xmax($2::pg_snapshot) AND o.tx < pg_snapshot_xmax($3::pg_snapshot)))
  AND pg_visible_in_snapshot(o.tx, $3::pg_snapshot)
  AND ` + AfterCursor("$4::xid8", "$5::bigint", "pg_snapshot_xmin($2::pg_snapshot)") + ` AND (o.tx, o.seq) <= ($6::xid8, $7::bigint)
  AND o.seq <> ALL(ARRAY(SELECT unnest(d.seqs) FROM {settle} AS d WHERE d.batch_id = $1 AND d.kind IN ('p', 'f')))
ORDER BY o.tx, o.seq`)
	// The same of a batch of an ordered table's window, taken in ord.
	q.reclaimOrd = r.Replace(`WITH ` + InflightCTE("$6", "$1") + `
SELECT {columns}, 0, '', NULL::timestamptz, NULL::timestamptz, o.ord, {blocked} FROM {table} AS o, inflight AS i
WHERE o.ord > $4 AND o.ord <= $5 AND pg_visible_in_snapshot(o.tx, $3::pg_snapshot) AND NOT pg_visible_in_snapshot(o.tx, $2::pg_snapshot)
  AND o.seq <> ALL(ARRAY(SELECT unnest(d.seqs) FROM {settle} AS d WHERE d.batch_id = $1 AND d.kind IN ('p', 'f')))
ORDER BY o.ord`)
	// The latest gen of each batch from $1 on, with what was settled of it.
	q.unfinished = r.Replace(`SELECT b.batch_id, b.gen, b.n, b.lo::text, b.hi::text, b.after_tx::text, b.after_seq, b.last_tx::text, b.last_seq, b.more,
	b.lease_until < now()
	OR EXISTS (SELECT 1 FROM {settle} AS r WHERE r.batch_id = b.batch_id AND r.gen = b.gen AND r.kind = 'r'),
	(SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM {settle} AS d WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f')),
	pg_postmaster_start_time()::text
FROM {batch} AS b
WHERE b.batch_id >= $1 AND NOT EXISTS (SELECT 1 FROM {batch} AS l WHERE l.batch_id = b.batch_id AND l.gen > b.gen)
ORDER BY b.batch_id LIMIT 20000`)
	q.insertBatch = r.Replace(`INSERT INTO {batch} (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
VALUES ($1, $2, $3::pg_snapshot, $4::pg_snapshot, $5::xid8, $6, $7::xid8, $8, $9, $10, $11, now() + $12::bigint * interval '1 microsecond', $13::text[])
RETURNING lease_until`)
	const failedReturning = `RETURNING o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
	o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at, o.ord, false`
	// Whether a failed message is due again (Maintain's look): the claims
	// below decide which may be taken.
	q.failedDue = r.Replace(`SELECT EXISTS (SELECT 1 FROM {failed}
	WHERE available_at <= now() AND published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL
	  AND (claimed_until IS NULL OR claimed_until < now()))`)
	// A backend that reads its table unordered takes no message with a
	// key from it if it is ordered (it checks the mode in the statement):
	// the claim of an ordered table is the next one.
	q.failedClaim = r.Replace(`UPDATE {failed} AS o SET claim_token = $2, claimed_until = now() + $3::bigint * interval '1 microsecond'
WHERE o.id IN (SELECT id FROM {failed}
	WHERE available_at <= now() AND published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL
	  AND (claimed_until IS NULL OR claimed_until < now()) AND (event_key = '' OR NOT {ordered})
	ORDER BY available_at LIMIT $1 FOR UPDATE SKIP LOCKED)
` + failedReturning)
	// On an ordered table, the failed messages of a key are taken from its
	// first on, while each is due, unclaimed and not parked, and while no
	// unfinished batch (from $4 on) holds the key; the claim lock
	// serialises these claims with the others, so that two never take
	// parts of one key. A key's first message is held back by nothing
	// else: every later message of its key is here too (see divert). The
	// keys are walked one index probe each (a loose index scan), and only
	// a key whose first message is ready has its messages read: a parked
	// key with a backlog held behind it costs one probe, not a read of the
	// backlog.
	q.failedClaimOrd = r.Replace(`WITH RECURSIVE ` + InflightCTE("$4", "0") + `,
keys AS (
	(SELECT f.event_key FROM {failed} AS f
	 WHERE f.published_at IS NULL AND f.discarded_at IS NULL AND f.event_key > '' ORDER BY f.event_key LIMIT 1)
	UNION ALL
	SELECT (SELECT f.event_key FROM {failed} AS f
	        WHERE f.published_at IS NULL AND f.discarded_at IS NULL AND f.event_key > k.event_key ORDER BY f.event_key LIMIT 1)
	FROM keys AS k WHERE k.event_key IS NOT NULL
), heads AS (
	SELECT h.* FROM keys AS k CROSS JOIN LATERAL (
		SELECT f.event_key, f.available_at, f.parked_at, f.claimed_until FROM {failed} AS f
		WHERE f.published_at IS NULL AND f.discarded_at IS NULL AND f.event_key = k.event_key
		ORDER BY coalesce(f.ord, 0), f.seq LIMIT 1) AS h
	WHERE k.event_key IS NOT NULL
), ready AS (
	SELECT h.event_key FROM heads AS h, inflight AS i
	WHERE h.available_at <= now() AND h.parked_at IS NULL AND (h.claimed_until IS NULL OR h.claimed_until < now())
	  AND NOT i.every AND NOT h.event_key = ANY(i.keys)
), runs AS (
	SELECT r.id, r.ord, r.seq FROM ready AS e CROSS JOIN LATERAL (
		SELECT d.*, bool_and(d.due) OVER (ORDER BY coalesce(d.ord, 0), d.seq) AS run FROM (
			SELECT f.id, f.ord, f.seq,
				f.available_at <= now() AND f.parked_at IS NULL AND (f.claimed_until IS NULL OR f.claimed_until < now()) AS due
			FROM {failed} AS f
			WHERE f.published_at IS NULL AND f.discarded_at IS NULL AND f.event_key = e.event_key
			ORDER BY coalesce(f.ord, 0), f.seq LIMIT $1) AS d) AS r
	WHERE r.run
), free AS (
	SELECT f.id, f.ord, f.seq FROM {failed} AS f
	WHERE f.event_key = '' AND f.available_at <= now() AND f.published_at IS NULL AND f.parked_at IS NULL AND f.discarded_at IS NULL
	  AND (f.claimed_until IS NULL OR f.claimed_until < now())
	ORDER BY f.available_at LIMIT $1
)
UPDATE {failed} AS o SET claim_token = $2, claimed_until = now() + $3::bigint * interval '1 microsecond'
WHERE o.id IN (SELECT c.id FROM (SELECT * FROM runs UNION ALL SELECT * FROM free) AS c ORDER BY coalesce(c.ord, 0), c.seq LIMIT $1)
` + failedReturning)
	// Messages $4 (seqs $3) of gen $2 of batch $1, which cannot be
	// relayed as written (reasons $5): the batch records them as failed,
	// and their copies in the failed table are parked.
	q.parkUnfit = r.Replace(`WITH s AS (
	INSERT INTO {settle} (batch_id, gen, kind, seqs)
	SELECT $1, $2, 'f', $3::bigint[] WHERE ` + ownBatch("$6") + `
	RETURNING 1)
INSERT INTO {failed} AS f (id, seq, ord, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, last_error, available_at, parked_at)
SELECT o.id, o.seq, o.ord, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
	1, u.reason, now(), now()
FROM unnest($3::bigint[], $4::uuid[], $5::text[]) AS u(seq, id, reason) JOIN {table} AS o ON o.id = u.id AND o.seq = u.seq
WHERE EXISTS (SELECT 1 FROM s)
ON CONFLICT (id) DO UPDATE SET attempts = f.attempts + 1, last_error = excluded.last_error, parked_at = now(),
	claim_token = NULL, claimed_until = NULL`)
	q.divert = r.Replace(`WITH s AS (
	INSERT INTO {settle} (batch_id, gen, kind, seqs)
	SELECT $1, $2, 'f', $3::bigint[] WHERE ` + ownBatch("$5") + `
	RETURNING 1)
INSERT INTO {failed} (id, seq, ord, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at, attempts, available_at)
SELECT o.id, o.seq, o.ord, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at, 0, now()
FROM {table} AS o WHERE o.id = ANY($4::uuid[]) AND EXISTS (SELECT 1 FROM s)
ON CONFLICT (id) DO NOTHING`)
	return q
}

// Texts returns every statement, by name, for the tests that look into
// them (for a placeholder left unfilled, say).
func (b *Backend) Texts() map[string]string {
	q := &b.q
	return map[string]string{"claim": q.claim, "reclaim": q.reclaim, "reclaimOrd": q.reclaimOrd, "unfinished": q.unfinished,
		"settle": q.settle, "settleFailed": q.settleFailed, "releaseFailedIDs": q.releaseFailedIDs, "failedClaim": q.failedClaim,
		"failedClaimOrd": q.failedClaimOrd, "divert": q.divert, "failedDue": q.failedDue, "fail": q.fail, "refail": q.refail,
		"parkUnfit": q.parkUnfit, "releaseBatch": q.releaseBatch, "releaseFailed": q.releaseFailed, "insertBatch": q.insertBatch,
		"latestBatch": q.latestBatch, "lockClaims": q.lockClaims, "counts": q.counts, "parked": q.parked, "retry": q.retry,
		"retryAll": q.retryAll, "discard": q.discard, "discardAll": q.discardAll, "horizon": q.horizon, "purgeFailed": q.purgeFailed,
		"rotation": q.rotation, "sequence": q.sequence, "leases": q.leases, "blockedKeys": q.blockedKeys, "keyQueue": q.keyQueue,
		"publishedByMinute": q.byMinute, "held": q.held}
}

// notTakenOver fences a settle of gen $2 of batch $1: no later gen of the
// batch was claimed (taken over after its lease or a release). A settle
// running while a take-over commits is kept apart by the take-over's SHARE
// lock on the settle table (see takeOver).
const notTakenOver = `NOT EXISTS (SELECT 1 FROM {batch} WHERE batch_id = $1 AND gen > $2)`

// ownBatch is notTakenOver for gen $2 of batch $1 claimed under token tok
// (a parameter), and the batch's row is that claim's. A batch id is the
// last one plus one: after a failover that lost the old primary's last
// commits (asynchronous replication), the new primary gives out again the
// ids of batches it never saw, and a relay that claimed one of them on the
// old primary would otherwise settle, under the same id and gen, another
// relay's batch, and mark published messages it never published. Such a
// settle finds its lease lost instead.
func ownBatch(tok string) string {
	return `EXISTS (SELECT 1 FROM {batch} WHERE batch_id = $1 AND gen = $2 AND token = ` + tok + `::uuid) AND ` + notTakenOver
}

// blocked is a condition on the event o, beside the inflight i: its table
// is ordered and its key has a message in the failed table that is
// neither published nor discarded, or an unfinished batch holds it (every
// key, when a batch claimed while the table was unordered is unfinished).
// Such a message is set aside behind it (divert).
func blocked(t Table) string {
	return `(` + t.OrderedNow + ` AND o.event_key <> '' AND (i.every OR o.event_key = ANY(i.keys) OR EXISTS (SELECT 1 FROM ` + t.Failed + ` AS fl
	WHERE fl.event_key = o.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL)))`
}

// lowOrZero is the low-water mark low, or 0 when the batch ids are all
// below it: the batch table was emptied (TRUNCATE, as outbox bench does
// between runs) and its ids begun again.
func lowOrZero(low string) string {
	return `(CASE WHEN ` + low + `::bigint > (SELECT coalesce(max(batch_id), 0) FROM {batch}) THEN 0 ELSE ` + low + `::bigint END)`
}

// AfterCursor bounds a range of the tx index (o.tx, o.seq) from below:
// after the cursor (tx, seq), and from transaction from on, whichever is
// later, as one row comparison. Given the two bounds apart, PostgreSQL's
// index scan may begin at the lower one; from a cursor of 0 (a window's
// first batch) that is the first event of the partition, and every claim
// read the whole index (TestLogClaimReadsNoHistory). The claim function
// of package outbox's DDL uses it too.
func AfterCursor(tx, seq, from string) string {
	return `(o.tx, o.seq) > (greatest(` + tx + `, ` + from + `), CASE WHEN ` + tx + ` >= ` + from + ` THEN ` + seq + ` ELSE -9223372036854775808 END)`
}

// InflightCTE names "u", the unfinished batches from batch low on other
// than batch except, and "inflight": whether one of them was claimed while
// the table was unordered (every), and the keys they hold. Its {batch}
// and {settle} are the caller's to fill (the claim function uses it too).
func InflightCTE(low, except string) string {
	return `u AS (
	SELECT b.keys FROM {batch} AS b
	WHERE b.batch_id >= ` + lowOrZero(low) + ` AND b.batch_id <> ` + except + `
	  AND NOT EXISTS (SELECT 1 FROM {batch} AS y WHERE y.batch_id = b.batch_id AND y.gen > b.gen)
	  AND b.n > (SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM {settle} AS d
	             WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f'))
), inflight AS (SELECT coalesce(bool_or(u.keys IS NULL), false) AS every,
	coalesce(array_agg(DISTINCT x.k) FILTER (WHERE x.k IS NOT NULL), '{}') AS keys
	FROM u LEFT JOIN LATERAL unnest(u.keys) AS x(k) ON true)`
}

// releaseBatchSQL gives back the batch that claim token $1 took (its first
// gen or a take-over's), as a relay releases one: a settle of kind r,
// after which the next claim takes the batch over.
const releaseBatchSQL = `INSERT INTO {settle} (batch_id, gen, kind, seqs)
SELECT b.batch_id, b.gen, 'r', '{}'::bigint[] FROM {batch} AS b
WHERE b.token = $1::uuid AND NOT EXISTS (SELECT 1 FROM {batch} AS l WHERE l.batch_id = b.batch_id AND l.gen > b.gen)`

// releaseFailedSQL gives back the messages of the failed table that claim
// token $1 took.
const releaseFailedSQL = `UPDATE {failed}
SET claim_token = NULL, claimed_until = NULL
WHERE claim_token = $1::uuid AND published_at IS NULL`
