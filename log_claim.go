package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strconv"
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

	claimSQL, reclaimSQL, unfinishedSQL, failedClaimSQL string

	mu       sync.Mutex
	low      int64     // no batch below it is unfinished, as far as this store has seen
	nextScan time.Time // when to look for batches to take over

	nextMaintain time.Time // when to rotate partitions
	nextFailed   time.Time // when to look for failed messages due again
}

const logColumns = `o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at`

func newLogStore(s *Store, l logTables) *logStore {
	r := strings.NewReplacer("{table}", s.t.quoted, "{batch}", l.batch, "{settle}", l.settle, "{failed}", l.failed, "{columns}", logColumns)
	ls := &logStore{s: s, l: l}
	ls.claimSQL = `SELECT * FROM ` + l.claimFn + `($1, $2, $3, $4::uuid)`
	// The messages of batch $1 that no gen published or failed.
	ls.reclaimSQL = r.Replace(`SELECT {columns}, 0, '', NULL::timestamptz, NULL::timestamptz FROM {table} AS o
WHERE (o.tx = ANY(ARRAY(SELECT pg_snapshot_xip($2::pg_snapshot))) OR (o.tx >= pg_snapshot_xmax($2::pg_snapshot) AND o.tx < pg_snapshot_xmax($3::pg_snapshot)))
  AND pg_visible_in_snapshot(o.tx, $3::pg_snapshot)
  AND (o.tx, o.seq) > ($4::xid8, $5::bigint) AND (o.tx, o.seq) <= ($6::xid8, $7::bigint)
  AND o.seq <> ALL(ARRAY(SELECT unnest(d.seqs) FROM {settle} AS d WHERE d.batch_id = $1 AND d.kind IN ('p', 'f')))
ORDER BY o.tx, o.seq`)
	// The latest gen of each batch from $1 on, with what was settled of it.
	ls.unfinishedSQL = r.Replace(`SELECT b.batch_id, b.gen, b.n, b.lo::text, b.hi::text, b.after_tx::text, b.after_seq, b.last_tx::text, b.last_seq, b.more,
	b.lease_until < now()
	OR EXISTS (SELECT 1 FROM {settle} AS r WHERE r.batch_id = b.batch_id AND r.gen = b.gen AND r.kind = 'r'),
	(SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM {settle} AS d WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f'))
FROM {batch} AS b
WHERE b.batch_id >= $1 AND NOT EXISTS (SELECT 1 FROM {batch} AS l WHERE l.batch_id = b.batch_id AND l.gen > b.gen)
ORDER BY b.batch_id LIMIT 20000`)
	ls.failedClaimSQL = r.Replace(`UPDATE {failed} AS o SET claim_token = $2, claimed_until = now() + $3::bigint * interval '1 microsecond'
WHERE o.id IN (SELECT id FROM {failed}
	WHERE available_at <= now() AND published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL
	  AND (claimed_until IS NULL OR claimed_until < now())
	ORDER BY available_at LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING o.id, o.seq, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
	o.attempts, coalesce(o.last_error, ''), o.claimed_until, o.parked_at`)
	return ls
}

// batchRef is the claim of a message taken in a batch, "b:<batch>:<gen>",
// or of one taken from the failed table, "f:<token>".
type batchRef struct {
	batch int64
	gen   int
	token string // of a failed message's claim
}

func parseRef(s string) (batchRef, bool) {
	if tok, ok := strings.CutPrefix(s, "f:"); ok {
		return batchRef{token: tok}, true
	}
	rest, ok := strings.CutPrefix(s, "b:")
	if !ok {
		return batchRef{}, false
	}
	b, g, ok := strings.Cut(rest, ":")
	if !ok {
		return batchRef{}, false
	}
	batch, err1 := strconv.ParseInt(b, 10, 64)
	gen, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil {
		return batchRef{}, false
	}
	return batchRef{batch: batch, gen: gen}, true
}

func (r batchRef) String() string {
	if r.token != "" {
		return "f:" + r.token
	}
	return fmt.Sprintf("b:%d:%d", r.batch, r.gen)
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

func (ls *logStore) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	var msgs []Message
	step := func(take func() ([]Message, error)) error {
		more, err := take()
		msgs = append(msgs, more...)
		return err
	}
	err := func() error {
		if ls.failedDue() {
			if err := step(func() ([]Message, error) { return ls.claimFailed(ctx, db, n, lease) }); err != nil {
				return err
			}
		}
		if len(msgs) < n && ls.scanDue() {
			if err := step(func() ([]Message, error) { return ls.takeOver(ctx, db, n-len(msgs), len(msgs) == 0, lease) }); err != nil {
				return err
			}
		}
		if len(msgs) < n {
			return step(func() ([]Message, error) { return ls.claimNew(ctx, db, n-len(msgs), lease) })
		}
		return nil
	}()
	if err != nil && len(msgs) == 0 {
		return nil, err
	}
	// Messages already claimed are returned even if a later step failed:
	// the next claim meets the failure again.
	if ls.maintainDue() {
		if err := ls.maintain(ctx, db); err != nil && ctx.Err() == nil {
			ls.s.logger.WarnContext(ctx, "outbox: Rotating the partitions of a log table failed; trying again in a second",
				slog.String("table", ls.s.t.full), slog.Any("error", err))
		}
	}
	return msgs, nil
}

// maintainDue says whether this claim keeps the rotation going: every
// second.
func (ls *logStore) maintainDue() bool { return ls.due(&ls.nextMaintain, time.Second) }

// scanDue says whether this claim looks for batches to take over: at most
// every 250ms, and at once after a release in this process.
func (ls *logStore) scanDue() bool { return ls.due(&ls.nextScan, 250*time.Millisecond) }

// due says whether the time *next has come, and if so moves it on by every.
func (ls *logStore) due(next *time.Time, every time.Duration) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	now := time.Now()
	if now.Before(*next) {
		return false
	}
	*next = now.Add(every)
	return true
}

func (ls *logStore) scanSoon() {
	ls.mu.Lock()
	ls.nextScan = time.Time{}
	ls.mu.Unlock()
}

// failedDue says whether this claim looks for failed messages due again:
// at most every 250ms, and at once after a failure in this process.
func (ls *logStore) failedDue() bool { return ls.due(&ls.nextFailed, 250*time.Millisecond) }

func (ls *logStore) failedSoon() {
	ls.mu.Lock()
	ls.nextFailed = time.Time{}
	ls.mu.Unlock()
}

func (ls *logStore) claimFailed(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, ls.failedClaimSQL, n, token.String(), lease.Microseconds())
	if err != nil {
		return nil, err
	}
	return scanMessages(rows, batchRef{token: token.String()}.String())
}

// takeOver claims again the first batch whose lease ran out or that was
// released, if its messages fit in n (or whatever its size when alone),
// and moves the store's low-water mark past finished batches.
func (ls *logStore) takeOver(ctx context.Context, db *sql.DB, n int, alone bool, lease time.Duration) (msgs []Message, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			msgs = nil
		}
	}()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", ls.l.lockKey()); err != nil {
		return nil, err
	}
	ls.mu.Lock()
	low := ls.low
	ls.mu.Unlock()
	rows, err := tx.QueryContext(ctx, ls.unfinishedSQL, low)
	if err != nil {
		return nil, err
	}
	var (
		cand    *batchRow
		newLow  int64 = -1
		lastID  int64
		scanned int
	)
	for rows.Next() {
		var (
			b    batchRow
			due  bool
			done int
		)
		if err := rows.Scan(&b.id, &b.gen, &b.n, &b.lo, &b.hi, &b.afterTx, &b.afterSeq, &b.lastTx, &b.lastSeq, &b.more, &due, &done); err != nil {
			rows.Close()
			return nil, err
		}
		scanned++
		lastID = b.id
		if done >= b.n {
			continue
		}
		if newLow < 0 {
			newLow = b.id
		}
		if due && cand == nil && (b.n-done <= n || alone) {
			cand = &b
		}
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ls.mu.Lock()
	switch {
	case newLow >= 0:
		ls.low = max(ls.low, newLow)
	case scanned > 0:
		ls.low = max(ls.low, lastID)
	}
	ls.mu.Unlock()
	if cand == nil {
		return nil, nil
	}
	b := *cand
	b.gen++
	ref := batchRef{batch: b.id, gen: b.gen}
	// A mark of the batch's old generation is fenced by a snapshot ("no
	// later gen"): one already running when this take-over read the
	// settles would pass the fence and commit, and its messages would be
	// published again. The settle table's SHARE lock waits for the marks
	// in flight (the reclaim below then sees them) and holds new ones
	// until this commits (they then see the new generation and find their
	// lease lost).
	if _, err := tx.ExecContext(ctx, "LOCK TABLE "+ls.l.settle+" IN SHARE MODE"); err != nil {
		return nil, err
	}
	rs, err := tx.QueryContext(ctx, ls.reclaimSQL, b.id, b.lo, b.hi, b.afterTx, b.afterSeq, b.lastTx, b.lastSeq)
	if err != nil {
		return nil, err
	}
	msgs, err = scanMessages(rs, ref.String())
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil // settled meanwhile
	}
	b.n = len(msgs)
	return ls.insertBatch(ctx, tx, b, lease, msgs)
}

// claimNew takes the next part of the current window, or opens the next
// window when the current one is drained (the table's claim function).
func (ls *logStore) claimNew(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, ls.claimSQL, n, lease.Microseconds(), ls.s.batchMaxBytes, token.String())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var msgs []Message
	for rows.Next() {
		var (
			m       Message
			batch   int64
			tx      string
			headers []byte
		)
		if err := rows.Scan(&batch, &m.ClaimedUntil, &m.ID, &m.Seq, &tx, &m.EventType, &m.Key, &m.Exchange, &m.RoutingKey, &m.Payload,
			&m.ContentType, &headers, &m.CreatedAt); err != nil {
			return nil, err
		}
		if err := m.decodeHeaders(headers); err != nil {
			return nil, err
		}
		m.claimToken = batchRef{batch: batch}.String()
		msgs = append(msgs, m)
	}
	return msgs, rows.Err()
}

// insertBatch records the batch of msgs and sets their lease.
func (ls *logStore) insertBatch(ctx context.Context, tx *sql.Tx, b batchRow, lease time.Duration, msgs []Message) ([]Message, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	var until time.Time
	err = tx.QueryRowContext(ctx, `INSERT INTO `+ls.l.batch+` (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until)
VALUES ($1, $2, $3::pg_snapshot, $4::pg_snapshot, $5::xid8, $6, $7::xid8, $8, $9, $10, $11, now() + $12::bigint * interval '1 microsecond')
RETURNING lease_until`, b.id, b.gen, b.lo, b.hi, b.afterTx, b.afterSeq, b.lastTx, b.lastSeq, b.n, b.more, token.String(), lease.Microseconds()).Scan(&until)
	if err != nil {
		return nil, err
	}
	for i := range msgs {
		msgs[i].ClaimedUntil = until
	}
	return msgs, nil
}
