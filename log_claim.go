package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// How a table of LayoutLog hands out its events: see the package doc,
// "The table". Claims of a table are serialised by a transaction-scoped
// advisory lock (lockKey); nothing here updates a row of the events or the
// batch and settle tables.

// logStore is a Store's relay-side half on a table of LayoutLog.
type logStore struct {
	s *Store
	l logTables

	claimSQL, reclaimSQL, reclaimOrdSQL, unfinishedSQL string
	settleSQL                                          string
	failedClaimSQL, failedClaimOrdSQL, divertSQL       string
	failedDueSQL                                       string
	failSQL, refailSQL, parkUnfitSQL                   string
	releaseBatchSQL, releaseFailedSQL                  string // orphan.go
	// log_operate.go
	countsSQL, parkedSQL, retrySQL, retryAllSQL, discardSQL, discardAllSQL string
	horizonSQL, purgeFailedSQL                                             string
	rotationSQL                                                            string
	// log_inspect.go
	leasesSQL, blockedKeysSQL, keyQueueSQL, publishedByMinuteSQL, heldSQL string

	mu  sync.Mutex
	low int64 // no batch below it is unfinished, as far as this store has seen
	// server is when the server that low was learnt from started
	// (pg_postmaster_start_time): a failover, or a restart, brings a
	// server whose batch table may have lost what low was learnt from.
	server string
	looks
	rot rotated
	now func() time.Time
}

const logColumns = `o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at`

func newLogStore(s *Store, l logTables) *logStore {
	r := strings.NewReplacer("{table}", s.t.quoted, "{batch}", l.batch, "{settle}", l.settle, "{failed}", l.failed, "{columns}", logColumns,
		"{blocked}", logBlocked(s.t, l), "{ordered}", s.t.orderedNow())
	ls := &logStore{s: s, l: l, looks: looks{lookEvery: lookEvery}, now: time.Now}
	ls.claimSQL = `SELECT * FROM ` + l.claimFn + `($1, $2, $3, $4::uuid, $5)`
	ls.rotationSQL = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END, (SELECT max(batch_id) FROM ` + l.batch + `) FROM ` + l.seq
	ls.releaseBatchSQL, ls.releaseFailedSQL = r.Replace(releaseLogBatchSQL), r.Replace(releaseLogFailedSQL)
	ls.countsSQL, ls.parkedSQL, ls.horizonSQL, ls.purgeFailedSQL = r.Replace(logCountsSQL), r.Replace(logParkedSQL), r.Replace(logHorizonSQL), r.Replace(logPurgeFailedSQL)
	ls.retrySQL, ls.retryAllSQL = r.Replace(logChangeParked(logRetrySet, true)), r.Replace(logChangeParked(logRetrySet, false))
	ls.discardSQL, ls.discardAllSQL = r.Replace(logChangeParked(`discarded_at = now()`, true)), r.Replace(logChangeParked(`discarded_at = now()`, false))
	ls.setInspections(r)
	// What became of messages $4 of gen $2 of batch $1 (kind $3), claimed
	// under token $5, unless a later gen took the batch over.
	ls.settleSQL = r.Replace(`INSERT INTO {settle} (batch_id, gen, kind, seqs)
SELECT $1, $2, $3::"char", $4::bigint[] WHERE ` + asyncCondition + ` AND ` + ownBatch("$5"))
	// A failed attempt at message $4 (seq $3) of gen $2 of batch $1
	// (claimed under token $17): the
	// batch records it as failed, and the message is copied to the failed
	// table (or, there already, counted again), to back off and park at
	// MaxAttempts ($15).
	ls.failSQL = r.Replace(`WITH s AS (
	INSERT INTO {settle} (batch_id, gen, kind, seqs)
	SELECT $1, $2, 'f', ARRAY[$3::bigint] WHERE ` + ownBatch("$17") + `
	RETURNING 1
)
INSERT INTO {failed} AS f (id, seq, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at,
	attempts, last_error, available_at, parked_at, ord)
SELECT $4::uuid, $3, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, 1, $13, now() + $14::bigint * interval '1 microsecond',
	CASE WHEN $15 <= 1 THEN now() END, NULLIF($16::bigint, 0)
FROM s
ON CONFLICT (id) DO UPDATE SET attempts = f.attempts + 1, last_error = excluded.last_error, available_at = excluded.available_at,
	parked_at = CASE WHEN f.attempts + 1 >= $15 THEN now() END, claim_token = NULL, claimed_until = NULL
RETURNING attempts, parked_at IS NOT NULL`)
	// A failed attempt at message $1 taken from the failed table under
	// claim $2: it backs off ($4) and parks at MaxAttempts ($5).
	ls.refailSQL = r.Replace(`UPDATE {failed} SET attempts = attempts + 1, last_error = $3,
	available_at = now() + $4::bigint * interval '1 microsecond', claim_token = NULL, claimed_until = NULL,
	parked_at = CASE WHEN attempts + 1 >= $5 THEN now() END
WHERE id = $1 AND claim_token = $2::uuid AND published_at IS NULL
RETURNING attempts, parked_at IS NOT NULL`)
	// The messages of batch $1 that no gen published or failed, with
	// whether their key is blocked: it has a message in the failed table,
	// or another unfinished batch (from $8 on) holds it. The window's
	// transactions begin at xmin(lo).
	ls.reclaimSQL = r.Replace(`WITH ` + inflightCTE("$8", "$1") + `
SELECT {columns}, 0, '', NULL::timestamptz, NULL::timestamptz, o.ord, {blocked} FROM {table} AS o, inflight AS i
WHERE (o.tx = ANY(ARRAY(SELECT pg_snapshot_xip($2::pg_snapshot))) OR (o.tx >= pg_snapshot_xmax($2::pg_snapshot) AND o.tx < pg_snapshot_xmax($3::pg_snapshot)))
  AND pg_visible_in_snapshot(o.tx, $3::pg_snapshot)
  AND ` + afterCursor("$4::xid8", "$5::bigint", "pg_snapshot_xmin($2::pg_snapshot)") + ` AND (o.tx, o.seq) <= ($6::xid8, $7::bigint)
  AND o.seq <> ALL(ARRAY(SELECT unnest(d.seqs) FROM {settle} AS d WHERE d.batch_id = $1 AND d.kind IN ('p', 'f')))
ORDER BY o.tx, o.seq`)
	// The same of a batch of an ordered table's window, taken in ord.
	ls.reclaimOrdSQL = r.Replace(`WITH ` + inflightCTE("$6", "$1") + `
SELECT {columns}, 0, '', NULL::timestamptz, NULL::timestamptz, o.ord, {blocked} FROM {table} AS o, inflight AS i
WHERE o.ord > $4 AND o.ord <= $5 AND pg_visible_in_snapshot(o.tx, $3::pg_snapshot) AND NOT pg_visible_in_snapshot(o.tx, $2::pg_snapshot)
  AND o.seq <> ALL(ARRAY(SELECT unnest(d.seqs) FROM {settle} AS d WHERE d.batch_id = $1 AND d.kind IN ('p', 'f')))
ORDER BY o.ord`)
	// The latest gen of each batch from $1 on, with what was settled of it.
	ls.unfinishedSQL = r.Replace(`SELECT b.batch_id, b.gen, b.n, b.lo::text, b.hi::text, b.after_tx::text, b.after_seq, b.last_tx::text, b.last_seq, b.more,
	b.lease_until < now()
	OR EXISTS (SELECT 1 FROM {settle} AS r WHERE r.batch_id = b.batch_id AND r.gen = b.gen AND r.kind = 'r'),
	(SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM {settle} AS d WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f')),
	pg_postmaster_start_time()::text
FROM {batch} AS b
WHERE b.batch_id >= $1 AND NOT EXISTS (SELECT 1 FROM {batch} AS l WHERE l.batch_id = b.batch_id AND l.gen > b.gen)
ORDER BY b.batch_id LIMIT 20000`)
	const failedReturning = `RETURNING o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
	o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at, o.ord, false`
	// A store that reads its table unordered takes no message with a key
	// from it if it is ordered (it checks the mode in the statement): the
	// claim of an ordered table is the next one.
	// Whether a failed message is due again (Maintain's look): the claims
	// above decide which may be taken.
	ls.failedDueSQL = r.Replace(`SELECT EXISTS (SELECT 1 FROM {failed}
	WHERE available_at <= now() AND published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL
	  AND (claimed_until IS NULL OR claimed_until < now()))`)
	ls.failedClaimSQL = r.Replace(`UPDATE {failed} AS o SET claim_token = $2, claimed_until = now() + $3::bigint * interval '1 microsecond'
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
	ls.failedClaimOrdSQL = r.Replace(`WITH RECURSIVE ` + inflightCTE("$4", "0") + `,
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
	ls.parkUnfitSQL = r.Replace(`WITH s AS (
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
	ls.divertSQL = r.Replace(`WITH s AS (
	INSERT INTO {settle} (batch_id, gen, kind, seqs)
	SELECT $1, $2, 'f', $3::bigint[] WHERE ` + ownBatch("$5") + `
	RETURNING 1)
INSERT INTO {failed} (id, seq, ord, event_type, event_key, exchange, routing_key, payload, content_type, headers, created_at, attempts, available_at)
SELECT o.id, o.seq, o.ord, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at, 0, now()
FROM {table} AS o WHERE o.id = ANY($4::uuid[]) AND EXISTS (SELECT 1 FROM s)
ON CONFLICT (id) DO NOTHING`)
	return ls
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

// logBlocked is a condition on the event o, beside the inflight i: its
// table is ordered and its key has a message in the failed table that is
// neither published nor discarded, or an unfinished batch holds it (every
// key, when a batch claimed while the table was unordered is unfinished).
// Such a message is set aside behind it (divert).
func logBlocked(t table, l logTables) string {
	return `(` + t.orderedNow() + ` AND o.event_key <> '' AND (i.every OR o.event_key = ANY(i.keys) OR EXISTS (SELECT 1 FROM ` + l.failed + ` AS fl
	WHERE fl.event_key = o.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL)))`
}

// lowOrZero is the low-water mark low, or 0 when the batch ids are all
// below it: the batch table was emptied (TRUNCATE, as outbox bench does
// between runs) and its ids begun again.
func lowOrZero(low string) string {
	return `(CASE WHEN ` + low + `::bigint > (SELECT coalesce(max(batch_id), 0) FROM {batch}) THEN 0 ELSE ` + low + `::bigint END)`
}

// afterCursor bounds a range of the tx index (o.tx, o.seq) from below:
// after the cursor (tx, seq), and from transaction from on, whichever is
// later, as one row comparison. Given the two bounds apart, PostgreSQL's
// index scan may begin at the lower one; from a cursor of 0 (a window's
// first batch) that is the first event of the partition, and every claim
// read the whole index (TestLogClaimReadsNoHistory).
func afterCursor(tx, seq, from string) string {
	return `(o.tx, o.seq) > (greatest(` + tx + `, ` + from + `), CASE WHEN ` + tx + ` >= ` + from + ` THEN ` + seq + ` ELSE -9223372036854775808 END)`
}

// inflightCTE names "u", the unfinished batches from batch low on other
// than batch except, and "inflight": whether one of them was claimed while
// the table was unordered (every), and the keys they hold.
func inflightCTE(low, except string) string {
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

// batchRef is the claim of a message taken in a batch: the batch, its
// generation (a take-over claims it again under the next) and the claim's
// token, written in the batch's row (see ownBatch). One taken from the
// failed table has a failedClaim.
type batchRef struct {
	batch int64
	gen   int
	token uuid.UUID
}

// batchRow is a row of the batch table.
type batchRow struct {
	id                int64
	gen, n            int
	lo, hi            string
	afterTx, lastTx   string
	afterSeq, lastSeq int64
	more              bool
}

func (ls *logStore) claimFailed(ctx context.Context, db *sql.DB, n int, lease time.Duration) (msgs []Message, err error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	defer func() {
		if ls.s.giveBack(ctx, execGiveBack(db, ls.releaseFailedSQL, token.String()), err, false) { // see orphan.go
			ls.failedSoon()
		}
	}()
	ref := failedClaim(token.String())
	if ls.s.Ordering() != OrderedByKey {
		rows, err := db.QueryContext(ctx, ls.failedClaimSQL, n, token.String(), lease.Microseconds())
		if err != nil {
			return nil, err
		}
		msgs, _, err := scanLogMessages(rows, ref)
		if err != nil {
			return nil, err
		}
		return ls.parkUnfitFailed(ctx, db, token.String(), msgs)
	}
	msgs, err = inTx(ctx, db, func(tx *sql.Tx) ([]Message, error) {
		if err := ls.lockClaims(ctx, tx); err != nil {
			return nil, err
		}
		ls.mu.Lock()
		low := ls.low
		ls.mu.Unlock()
		rows, err := tx.QueryContext(ctx, ls.failedClaimOrdSQL, n, token.String(), lease.Microseconds(), low)
		if err != nil {
			return nil, err
		}
		msgs, _, err := scanLogMessages(rows, ref)
		slices.SortFunc(msgs, func(a, b Message) int { return cmp.Or(cmp.Compare(a.ord, b.ord), cmp.Compare(a.Seq, b.Seq)) })
		return msgs, err
	})
	if err != nil {
		return nil, err
	}
	return ls.parkUnfitFailed(ctx, db, token.String(), msgs)
}

// parkUnfitFailed parks, under claim token, the messages taken from the
// failed table that cannot be relayed as written, and returns the others;
// in ordered mode the later messages of a parked one's key are given back
// to wait behind it.
func (ls *logStore) parkUnfitFailed(ctx context.Context, db *sql.DB, token string, msgs []Message) ([]Message, error) {
	kept, err := ls.s.parkEach(ctx, msgs, ls.s.Ordering() == OrderedByKey,
		func(id, reason string) (int, error) {
			var (
				attempts int
				parked   bool
			)
			err := db.QueryRowContext(ctx, ls.refailSQL, id, token, reason, 0, 1).Scan(&attempts, &parked)
			return attempts, err
		},
		func(ids []string) error { _, err := ls.settleFailed(ctx, db, 'r', ids, token); return err })
	if len(kept) < len(msgs) {
		ls.failedSoon()
	}
	return kept, err
}

// lockClaims takes the table's claim lock for the rest of tx: claims,
// take-overs and ordered claims of the failed table take turns.
func (ls *logStore) lockClaims(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", ls.l.lockKey())
	return err
}

// scanLogMessages reads the columns of scanMessages, then ord and whether
// the message's key is blocked (see logBlocked), and returns the indices
// of the blocked ones.
func scanLogMessages(rows *sql.Rows, claim claimRef) (msgs []Message, blocked []int, err error) {
	defer rows.Close()
	for rows.Next() {
		var (
			ord sql.NullInt64
			b   bool
		)
		m, err := scanMessage(rows, claim, &ord, &b)
		if err != nil {
			return nil, nil, err
		}
		m.ord = ord.Int64
		if b {
			blocked = append(blocked, len(msgs))
		}
		msgs = append(msgs, m)
	}
	return msgs, blocked, rows.Err()
}

// divert sets aside the messages at blocked of msgs, which batch ref
// took: on an ordered table, a message whose key has a message in the
// failed table waits there behind it (attempts 0, due at once), and its
// batch records it as failed; the others are returned. A batch taken over
// meanwhile is left alone (the messages are another relay's).
func (ls *logStore) divert(ctx context.Context, q execer, ref batchRef, msgs []Message, blocked []int) ([]Message, error) {
	if len(blocked) == 0 {
		return msgs, nil
	}
	seqs := make([]int64, len(blocked))
	ids := make([]string, len(blocked))
	for i, j := range blocked {
		seqs[i], ids[i] = msgs[j].Seq, msgs[j].ID
	}
	if _, err := q.ExecContext(ctx, ls.divertSQL, ref.batch, ref.gen, seqs, ids, ref.token.String()); err != nil {
		return nil, fmt.Errorf("setting aside %d message(s) behind a failed message of their key: %w", len(blocked), err)
	}
	kept := make([]Message, 0, len(msgs)-len(blocked))
	for i, j := 0, 0; i < len(msgs); i++ {
		if j < len(blocked) && blocked[j] == i {
			j++
			continue
		}
		kept = append(kept, msgs[i])
	}
	ls.failedSoon()
	return kept, nil
}

// inTx runs f in a transaction, committed when f succeeds; what f took
// is returned only then.
func inTx(ctx context.Context, db *sql.DB, f func(tx *sql.Tx) ([]Message, error)) ([]Message, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	msgs, err := f(tx)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return msgs, nil
}

// rowsQuerier is a *sql.DB or a *sql.Tx.
type rowsQuerier interface {
	querier
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// claimPresize bounds the room a claim makes for its messages before it
// reads them: a batch of the default size is read without growing it, and
// a claim with a large BatchSize that finds little does not hold room for
// all of it.
const claimPresize = 128

// claimNew takes the next part of the current window, or opens the next
// window when the current one is drained (the table's claim function). On
// an ordered table it stops before a message whose key an unfinished batch
// holds, and sets aside the messages of blocked keys (divert).
func (ls *logStore) claimNew(ctx context.Context, db *sql.DB, n int, lease time.Duration) (_ []Message, err error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	ls.mu.Lock()
	low := ls.low
	ls.mu.Unlock()
	committed := false                                                           // the claim did: what fails after it leaves its batch behind
	defer func() { ls.giveBackBatch(ctx, db, token.String(), err, committed) }() // see orphan.go
	rows, err := db.QueryContext(ctx, ls.claimSQL, n, lease.Microseconds(), ls.s.batchMaxBytes, token.String(), low)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var (
		msgs    = make([]Message, 0, min(n, claimPresize))
		blocked []int
		batch   int64
		ref     claimRef // every row is of the one batch
		ordered bool
		// Read and dropped (tx) or decoded (headers) before the next row:
		// not copied.
		tx, headers sql.RawBytes
	)
	for rows.Next() {
		var (
			m   Message
			ord sql.NullInt64
			b   bool
		)
		if err := rows.Scan(&batch, &m.ClaimedUntil, &m.ID, &m.Seq, &tx, &m.EventType, &m.Key, &m.Exchange, &m.RoutingKey, &m.Payload,
			&m.ContentType, &headers, &m.CreatedAt, &ord, &b, &ordered); err != nil {
			if m.ID == "" {
				return nil, badRowError{err}
			}
			m.unfit = err.Error() // parked below, with its batch
		} else {
			m.decodeHeaders(headers)
		}
		if ref == nil {
			ref = batchRef{batch: batch, token: token}
		}
		m.claim, m.ord = ref, ord.Int64
		if b {
			blocked = append(blocked, len(msgs))
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	committed = true
	if ordered && ls.s.Ordering() != OrderedByKey {
		// The table was made ordered since the store last read its
		// mode: the relay publishes this batch in ordered mode.
		ls.s.tm.set(OrderedByKey)
	}
	// What it could not set aside is set aside by whoever takes the
	// batch over after its lease: nothing of it is published meanwhile.
	return ls.setAside(ctx, db, batchRef{batch: batch, token: token}, msgs, blocked, ordered)
}

// setAside parks the messages of batch ref that cannot be relayed as
// written (parkUnfitSQL: its batch records them as failed, fenced like a
// mark by its gen) and sets aside those whose key is blocked (divert), on
// an ordered table with them the later messages of a parked one's key;
// it returns the others.
func (ls *logStore) setAside(ctx context.Context, q execer, ref batchRef, msgs []Message, blocked []int, ordered bool) ([]Message, error) {
	ordered = ordered || ls.s.Ordering() == OrderedByKey
	if slices.IndexFunc(msgs, func(m Message) bool { return m.unfit != "" }) >= 0 {
		var (
			kept        []Message
			keep        []int
			seqs        []int64
			ids, reason []string
			keys        = map[string]bool{}
		)
		for i, m := range msgs {
			switch {
			case m.unfit != "":
				seqs, ids, reason = append(seqs, m.Seq), append(ids, m.ID), append(reason, unfitReason(m))
				if ordered && m.Key != "" {
					keys[m.Key] = true
				}
				continue
			case slices.Contains(blocked, i) || keys[m.Key]:
				keep = append(keep, len(kept))
			}
			kept = append(kept, m)
		}
		if _, err := q.ExecContext(ctx, ls.parkUnfitSQL, ref.batch, ref.gen, seqs, ids, reason, ref.token.String()); err != nil {
			return nil, fmt.Errorf("parking %d message(s) that cannot be relayed as written: %w", len(ids), err)
		}
		for i, id := range ids {
			ls.s.warnParked(ctx, id, 1, reason[i])
		}
		ls.failedSoon()
		msgs, blocked = kept, keep
	}
	return ls.divert(ctx, q, ref, msgs, blocked)
}

// insertBatch records the batch of msgs and sets their lease.
func (ls *logStore) insertBatch(ctx context.Context, tx *sql.Tx, b batchRow, token string, lease time.Duration, msgs []Message) ([]Message, error) {
	var until time.Time
	// Its keys, which ordered claims keep out of other batches while it is
	// unfinished.
	keys := []string{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.Key != "" && !seen[m.Key] {
			seen[m.Key] = true
			keys = append(keys, m.Key)
		}
	}
	err := tx.QueryRowContext(ctx, `INSERT INTO `+ls.l.batch+` (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
VALUES ($1, $2, $3::pg_snapshot, $4::pg_snapshot, $5::xid8, $6, $7::xid8, $8, $9, $10, $11, now() + $12::bigint * interval '1 microsecond', $13::text[])
RETURNING lease_until`, b.id, b.gen, b.lo, b.hi, b.afterTx, b.afterSeq, b.lastTx, b.lastSeq, b.n, b.more, token, lease.Microseconds(), keys).Scan(&until)
	if err != nil {
		return nil, err
	}
	for i := range msgs {
		msgs[i].ClaimedUntil = until
	}
	return msgs, nil
}
