package pglog

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgerr"
	"github.com/acemq/outbox/internal/pgschema"
	"github.com/acemq/outbox/internal/pgsql"
)

// The operators' view of a table of LayoutLog. Pending messages are those
// no claim has taken yet (after the cursor), those of unfinished batches
// that were not settled, failed ones waiting to be tried again, those held
// behind them and parked ones (failed ones that exhausted their attempts).

// counts is what Stats and Gauges read of a log table: fresh and
// unsettled events are in the events table (those of unsettled batches
// whose lease has not expired in flight, the others ready to be taken
// over), failed ones and those held behind them in the failed table.
type counts struct {
	fresh, unsettled, unsettledInFlight                       int64
	failedInFlight, failedReady, failedRetrying, held, parked int64
	published, blockedKeys                                    int64
	oldest, oldestReady                                       float64
}

// latestCTE is the newest batch row: the cursor of the table.
const latestCTE = `l AS (SELECT lo, hi, last_tx, last_seq, more FROM {batch} ORDER BY batch_id DESC, gen DESC LIMIT 1)`

// freshCTE is the events no claim has taken yet: those not visible in
// the cursor's hi (a range of the tx index from hi's xmin), the rest of its
// window when it has more (a range from its last event, in tx, seq or, on
// an ordered table, in ord), and every event
// before the first claim; each part is limited to $1.
const freshCTE = `fresh AS (
	(SELECT o.created_at FROM l, {table} AS o
	 WHERE o.tx >= pg_snapshot_xmin(l.hi) AND NOT pg_visible_in_snapshot(o.tx, l.hi) LIMIT $1)
	UNION ALL
	(SELECT o.created_at FROM l, {table} AS o
	 WHERE l.more AND l.last_tx <> '0' AND (o.tx, o.seq) > (l.last_tx, l.last_seq) AND o.tx < pg_snapshot_xmax(l.hi)
	   AND pg_visible_in_snapshot(o.tx, l.hi) AND NOT pg_visible_in_snapshot(o.tx, l.lo) LIMIT $1)
	UNION ALL
	(SELECT o.created_at FROM l, {table} AS o
	 WHERE l.more AND l.last_tx = '0' AND o.ord > l.last_seq
	   AND pg_visible_in_snapshot(o.tx, l.hi) AND NOT pg_visible_in_snapshot(o.tx, l.lo) LIMIT $1)
	UNION ALL
	(SELECT o.created_at FROM {table} AS o WHERE NOT EXISTS (SELECT 1 FROM l) LIMIT $1))`

// unsettledFrom is the latest gen of each batch, its columns, the count of
// its messages not yet published or failed (remaining), and whether a relay
// still holds it (taken): its lease runs, and it was not released (a claim
// takes a released batch over at once, see unfinishedSQL).
const unsettledFrom = `(SELECT b.*,
	b.n - (SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM {settle} AS d
	       WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f')) AS remaining,
	b.lease_until > now()
	  AND NOT EXISTS (SELECT 1 FROM {settle} AS r WHERE r.batch_id = b.batch_id AND r.gen = b.gen AND r.kind = 'r') AS taken
	FROM {batch} AS b WHERE NOT EXISTS (SELECT 1 FROM {batch} AS x WHERE x.batch_id = b.batch_id AND x.gen > b.gen)) AS u`

// The states of a message of the failed table that is neither published
// nor discarded (f below): parked; else in flight (claimed); else held (on
// an ordered table, set aside behind a failed message of its key: it never
// failed itself) ; else ready or retrying (waiting out its backoff).
const (
	failedInFlight = `parked_at IS NULL AND claimed_until > now()`
	failedFree     = `parked_at IS NULL AND (claimed_until IS NULL OR claimed_until <= now())`
	failedHeld     = failedFree + ` AND last_error IS NULL`
	failedReady    = failedFree + ` AND last_error IS NOT NULL AND available_at <= now()`
	failedRetrying = failedFree + ` AND last_error IS NOT NULL AND available_at > now()`
)

// countsSQL counts a table's messages by state, each part of fresh
// limited to $1.
const countsSQL = `WITH ` + latestCTE + `,
` + freshCTE + `,
u AS (SELECT * FROM ` + unsettledFrom + ` WHERE u.remaining > 0),
f AS (SELECT * FROM {failed} WHERE published_at IS NULL AND discarded_at IS NULL)
SELECT (SELECT count(*) FROM fresh),
	(SELECT coalesce(sum(remaining), 0) FROM u),
	(SELECT coalesce(sum(remaining), 0) FROM u WHERE taken),
	(SELECT count(*) FROM f WHERE ` + failedInFlight + `),
	(SELECT count(*) FROM f WHERE ` + failedReady + `),
	(SELECT count(*) FROM f WHERE ` + failedRetrying + `),
	(SELECT count(*) FROM f WHERE ` + failedHeld + `),
	(SELECT count(*) FROM f WHERE parked_at IS NOT NULL),
	(SELECT coalesce(sum(cardinality(seqs)), 0) FROM {settle} WHERE kind = 'p' AND at > now() - interval '1 hour')
	  + (SELECT count(*) FROM {failed} WHERE published_at > now() - interval '1 hour'),
	(SELECT count(DISTINCT event_key) FROM f WHERE parked_at IS NOT NULL AND event_key <> ''),
	coalesce(extract(epoch FROM now() - least(
		(SELECT min(created_at) FROM fresh), (SELECT min(claimed_at) FROM u), (SELECT min(created_at) FROM f))), 0),
	coalesce(extract(epoch FROM now() - least(
		(SELECT min(created_at) FROM fresh), (SELECT min(claimed_at) FROM u WHERE NOT taken),
		(SELECT min(created_at) FROM f WHERE ` + failedReady + `))), 0)`

func (b *Backend) counts(ctx context.Context, db *sql.DB, limit int64) (counts, error) {
	var c counts
	err := db.QueryRowContext(ctx, b.q.counts, limit).Scan(&c.fresh, &c.unsettled, &c.unsettledInFlight, &c.failedInFlight, &c.failedReady, &c.failedRetrying, &c.held, &c.parked,
		&c.published, &c.blockedKeys, &c.oldest, &c.oldestReady)
	if err != nil {
		return counts{}, fmt.Errorf("outbox: counting messages of %s: %w", b.t.Full, err)
	}
	return c, nil
}

// ready is what a claim may take now: fresh events, those of batches
// whose lease expired (a claim takes them over) and failed ones due again.
func (c counts) ready() int64    { return c.fresh + c.unsettled - c.unsettledInFlight + c.failedReady }
func (c counts) inFlight() int64 { return c.unsettledInFlight + c.failedInFlight }
func (c counts) pending() int64 {
	return c.ready() + c.inFlight() + c.failedRetrying + c.held + c.parked
}

// parkedSQL lists up to $1 parked messages, the latest parked first.
const parkedSQL = `SELECT o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload,
	o.content_type, o.headers, o.created_at, o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at
FROM {failed} AS o WHERE o.parked_at IS NOT NULL AND o.published_at IS NULL AND o.discarded_at IS NULL` + pgsql.ParkedFilter + `
ORDER BY o.parked_at DESC, coalesce(o.seq, 0) DESC LIMIT $1`

func (b *Backend) Parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, b.q.parked, q.Args()...)
	if err != nil {
		return nil, err
	}
	return pgsql.ScanRows(rows, nil)
}

// retrySet is what a retry does to a parked message of the failed
// table.
const retrySet = `parked_at = NULL, attempts = 0, available_at = now(), claim_token = NULL, claimed_until = NULL`

// changeParked sets set on the parked messages of the failed table,
// those whose ids are $1 (byID) or all of them, and counts them.
func changeParked(set string, byID bool) string {
	where := ""
	if byID {
		where = " AND id = ANY($1::uuid[])"
	}
	return `WITH c AS (UPDATE {failed} SET ` + set + `
	WHERE parked_at IS NOT NULL AND published_at IS NULL AND discarded_at IS NULL` + where + ` RETURNING 1)
SELECT count(*) FROM c`
}

// ChangeParked re-arms (retry) or discards parked messages, those among
// ids or, when ids is nil, all of them.
func (b *Backend) ChangeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	query, args := b.q.retry, []any{ids}
	switch {
	case discard && ids == nil:
		query, args = b.q.discardAll, nil
	case discard:
		query = b.q.discard
	case ids == nil:
		query, args = b.q.retryAll, nil
	}
	defer b.failedSoon()
	var n int64
	err := db.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

// horizon is the snapshot every event visible in which is settled: the lo
// of the oldest unfinished batch, or the cursor's (its lo while its window
// has more, its hi when drained). Before the first claim nothing is.
func (b *Backend) horizon(ctx context.Context, q querier) (string, error) {
	b.mu.Lock()
	low := b.low // no batch below it is unfinished
	b.mu.Unlock()
	var h sql.NullString
	err := q.QueryRowContext(ctx, b.q.horizon, low).Scan(&h)
	if err != nil {
		return "", err
	}
	if !h.Valid {
		return "3:3:", nil
	}
	return h.String, nil
}

// horizonSQL reads the horizon (see horizon), from batch $1 on.
const horizonSQL = `WITH ` + latestCTE + `
SELECT coalesce(
	(SELECT u.lo::text FROM ` + unsettledFrom + ` WHERE u.remaining > 0 AND u.batch_id >= $1 ORDER BY u.batch_id LIMIT 1),
	(SELECT CASE WHEN l.more THEN l.lo ELSE l.hi END::text FROM l))`

// purge truncates the partitions of the events table whose every event is
// settled and older than olderThan, other than the one writers are in and
// the next.
// Each TRUNCATE waits at most 50ms for its lock and is skipped otherwise:
// writers never wait behind it, since they insert into other partitions.
func (b *Backend) purge(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	cur, err := b.current(ctx, db)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, i := range b.behind(cur) {
		n, _, err := b.truncate(ctx, db, i, olderThan, true)
		if err != nil {
			return total, err
		}
		total += n
	}
	// The failed table's copies of messages published or discarded long
	// enough ago, once their events are gone with their partitions: on an
	// ordered table it also carries the backlogs of hot keys.
	_, err = pgschema.DeleteInBatches(ctx, db, 10_000, nil, b.q.purgeFailed, olderThan.Microseconds())
	return total, err
}

// purgeFailedSQL deletes up to $2 of the failed table's copies of
// messages published or discarded more than $1 microseconds ago whose
// events are gone.
const purgeFailedSQL = `DELETE FROM {failed} WHERE id IN (
	SELECT f.id FROM {failed} AS f
	WHERE coalesce(f.published_at, f.discarded_at) < now() - $1::bigint * interval '1 microsecond'
	  AND NOT EXISTS (SELECT 1 FROM {table} AS o WHERE o.id = f.id)
	LIMIT $2)`

// behind lists the partitions of the events table other than cur, the one
// writers are in, and the next: those a purge may empty.
func (b *Backend) behind(cur int64) []int64 {
	parts := make([]int64, 0, b.t.Parts)
	for i := int64(0); i < b.t.Parts; i++ {
		if i != cur && i != (cur+1)%b.t.Parts {
			parts = append(parts, i)
		}
	}
	return parts
}

// current returns the partition writers are in.
func (b *Backend) current(ctx context.Context, q querier) (int64, error) {
	var last int64
	if err := q.QueryRowContext(ctx, b.q.sequence).Scan(&last); err != nil {
		return 0, fmt.Errorf("outbox: reading the sequence of %s: %w", b.t.Full, err)
	}
	return b.partitionOf(last), nil
}

// partitionOf is the partition of the events numbered from seq last on.
func (b *Backend) partitionOf(last int64) int64 { return (last / b.t.Chunk) % b.t.Parts }

// truncate empties partition i if every event in it is settled and none
// was written less than olderThan ago, and returns how many events it
// held (when count is set); emptied says that the partition is empty now
// (it was, or it was truncated).
func (b *Backend) truncate(ctx context.Context, db *sql.DB, i int64, olderThan time.Duration, count bool) (n int64, emptied bool, err error) {
	part := b.t.Partition(i)
	var any bool
	// An empty partition (most looks of the rotation) costs one statement,
	// not a transaction.
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+part+`)`).Scan(&any); err != nil || !any {
		return 0, err == nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = tx.Rollback() }()
	// Look before taking the lock, which claims would queue behind.
	if ok, err := b.purgeableNow(ctx, tx, part, olderThan); err != nil || !ok {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '50ms'`); err != nil {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, `LOCK TABLE `+part+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		if pgerr.State(err) == "55P03" {
			return 0, false, nil // busy: next time
		}
		return 0, false, err
	}
	// Under the lock no writer of the partition is in progress: every row
	// in it is committed, and the checks below see them all.
	ok, err := b.purgeableNow(ctx, tx, part, olderThan)
	if err != nil || !ok {
		return 0, false, err
	}
	if count {
		if n, err = estimateRows(ctx, tx, part); err != nil {
			return 0, false, err
		}
	}
	if _, err := tx.ExecContext(ctx, `TRUNCATE `+part); err != nil {
		return 0, false, err
	}
	if err := tx.Commit(); err != nil {
		return 0, false, err
	}
	return n, true, nil
}

// estimateRows returns the planner's count of a partition's rows
// (pg_class.reltuples, kept by autovacuum as the partition fills): counting
// a partition of millions of rows would take longer than dropping it. A
// partition never analysed is counted.
func estimateRows(ctx context.Context, q querier, part string) (int64, error) {
	var n float64
	if err := q.QueryRowContext(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, part).Scan(&n); err != nil {
		return 0, err
	}
	if n < 0 {
		var c int64
		err := q.QueryRowContext(ctx, `SELECT count(*) FROM `+part).Scan(&c)
		return c, err
	}
	return int64(n), nil
}

// purgeableNow says whether every event of the partition is settled (it is
// visible in the horizon) and older than olderThan.
func (b *Backend) purgeableNow(ctx context.Context, q querier, part string, olderThan time.Duration) (bool, error) {
	h, err := b.horizon(ctx, q)
	if err != nil {
		return false, err
	}
	var ok bool
	// The age is that of the newest transaction by id (its start, by the
	// database clock): one probe of the tx index, where a scan for any row
	// younger than the cutoff would read the partition.
	err = q.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+part+` WHERE tx >= pg_snapshot_xmin($1::pg_snapshot) AND NOT pg_visible_in_snapshot(tx, $1::pg_snapshot))
	AND coalesce((SELECT created_at < now() - $2::bigint * interval '1 microsecond' FROM `+part+` ORDER BY tx DESC, seq DESC LIMIT 1), true)`,
		h, olderThan.Microseconds()).Scan(&ok)
	return ok, err
}

// rotateAll keeps the rotation going: it empties the partition writers
// reach after the next one, if it is settled, and the finished partitions
// of the batch and settle tables. Maintain calls it every second (claims
// do, when nothing calls Maintain): one statement while nothing is to be
// emptied (see rotated).
func (b *Backend) rotateAll(ctx context.Context, db *sql.DB) error {
	var (
		last   int64
		latest sql.NullInt64
	)
	if err := db.QueryRowContext(ctx, b.q.rotation).Scan(&last, &latest); err != nil {
		return fmt.Errorf("outbox: reading the sequence of %s: %w", b.t.Full, err)
	}
	cur := b.partitionOf(last)
	b.mu.Lock()
	known := b.rot.events == cur+1
	b.mu.Unlock()
	if !known {
		_, emptied, err := b.truncate(ctx, db, (cur+2)%b.t.Parts, 0, false)
		if err != nil {
			return err
		}
		if emptied {
			b.mu.Lock()
			b.rot.events = cur + 1
			b.mu.Unlock()
		}
	}
	if !latest.Valid {
		return nil
	}
	return b.rotateBatches(ctx, db, latest.Int64)
}

// rotated is what the rotation found empty, which stays so while the
// partition writers are in and the one batch ids are in stay the same:
// writers reach the partition after the next one only by passing through
// the next, and a partition of the batch table gets rows only from the
// batch ids reaching it (a take-over inserts beside an unfinished batch,
// and an emptied partition holds none). Its Backend's mu guards it.
type rotated struct {
	events     int64 // the writers' partition (+1) when the one after the next was found empty; 0: none
	batches    int64 // the batch ids' partition (+1) when batchEmpty was found
	batchEmpty [BatchParts]bool
}

// rotateBatches truncates the partitions of the batch and settle tables
// that hold only finished batches, other than the one the latest batch id
// is in (it holds the cursor) and the next one.
func (b *Backend) rotateBatches(ctx context.Context, db *sql.DB, latest int64) error {
	cur := (latest / b.t.BatchChunk) % BatchParts
	b.mu.Lock()
	if b.rot.batches != cur+1 {
		b.rot.batches, b.rot.batchEmpty = cur+1, [BatchParts]bool{}
	}
	empty := b.rot.batchEmpty
	b.mu.Unlock()
	for i := int64(0); i < BatchParts; i++ {
		if i == cur || i == (cur+1)%BatchParts || empty[i] {
			continue
		}
		emptied, err := b.truncateBatches(ctx, db, i)
		if err != nil {
			return err
		}
		if emptied {
			b.mu.Lock()
			if b.rot.batches == cur+1 {
				b.rot.batchEmpty[i] = true
			}
			b.mu.Unlock()
		}
	}
	return nil
}

// truncateBatches empties partition i of the batch and settle tables if
// every batch in it is finished; emptied says that it is empty now.
func (b *Backend) truncateBatches(ctx context.Context, db *sql.DB, i int64) (emptied bool, err error) {
	bp, sp := b.t.BatchPartition(i), b.t.SettlePartition(i)
	unfinished := strings.NewReplacer("{batch}", bp, "{settle}", sp).Replace(`SELECT EXISTS (SELECT 1 FROM ` + unsettledFrom + ` WHERE u.remaining > 0)`)
	// Look before taking the lock: a partition just left behind by the
	// batch ids holds batches in flight for a few seconds.
	var any, ready bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+bp+`), NOT (`+unfinished+`)`).Scan(&any, &ready); err != nil || !any || !ready {
		return err == nil && !any, err
	}
	// Every claim reads every partition of the batch table, and claims
	// queue behind a LOCK that waits: the lock is taken only if no claim
	// holds it (NOWAIT), and held for no round trip: one statement (the
	// names are validated identifiers) locks, looks again, truncates and
	// commits.
	_, err = db.ExecContext(ctx, `DO $$ BEGIN
	LOCK TABLE `+bp+`, `+sp+` IN ACCESS EXCLUSIVE MODE NOWAIT;
	-- Again under the lock: a batch of this partition may have been
	-- taken over meanwhile.
	IF NOT (`+unfinished+`) THEN
		TRUNCATE `+bp+`, `+sp+`;
	END IF;
END $$`)
	if pgerr.State(err) == "55P03" {
		return false, nil // a claim holds it: next time
	}
	// Emptied, unless a batch of it was taken over meanwhile: the next
	// rotation looks again.
	return false, err
}

// Purgeable counts the events Purge would remove now.
func (b *Backend) Purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	cur, err := b.current(ctx, db)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, i := range b.behind(cur) {
		part := b.t.Partition(i)
		ok, err := b.purgeableNow(ctx, db, part, olderThan)
		if err != nil {
			return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", b.t.Full, err)
		}
		if !ok {
			continue
		}
		n, err := estimateRows(ctx, db, part)
		if err != nil {
			return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", b.t.Full, err)
		}
		total += n
	}
	return total, nil
}

// Pending counts the messages not published yet.
func (b *Backend) Pending(ctx context.Context, db *sql.DB) (int64, error) {
	c, err := b.counts(ctx, db, 1<<62)
	return c.pending(), err
}

// Counts reads the table's messages by state, each count stopping at
// limit (0: none).
func (b *Backend) Counts(ctx context.Context, db *sql.DB, limit int64) (backend.Counts, error) {
	if limit <= 0 {
		limit = 1 << 62
	}
	c, err := b.counts(ctx, db, limit)
	if err != nil {
		return backend.Counts{}, err
	}
	return backend.Counts{
		Ready: min(c.ready(), limit), InFlight: min(c.inFlight(), limit), Retrying: min(c.failedRetrying, limit),
		Held: min(c.held, limit), Parked: min(c.parked, limit), PublishedLastHour: c.published, BlockedKeys: c.blockedKeys,
		OldestPending: seconds(c.oldest), OldestReady: seconds(c.oldestReady),
	}, nil
}

// seconds is an age read from the database, to the millisecond.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// Reconcile does nothing: nothing is held in a log table but behind a
// failed message of its key (see divert), and Maintain rotates it.
func (*Backend) Reconcile(context.Context, *sql.DB, bool) (held, unheld int64, err error) {
	return 0, 0, nil
}

// Purge truncates the partitions whose every event is settled and older
// than olderThan (see purge), whatever batch says, and calls progress once.
func (b *Backend) Purge(ctx context.Context, db *sql.DB, olderThan time.Duration, _ int, progress func(int64)) (int64, error) {
	n, err := b.purge(ctx, db, olderThan)
	if err == nil && progress != nil {
		progress(n)
	}
	return n, err
}
