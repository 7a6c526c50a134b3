package outbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"
)

// Taking over a log table's batch: a relay's lease on it ran out, or it
// released it. The batch is claimed again under its next gen, and the
// marks of the old gen are fenced by it (notTakenOver).

// takeOverTx is takeOver in a transaction of its own.
func (ls *logStore) takeOverTx(ctx context.Context, db *sql.DB, n int, alone bool, lease time.Duration) ([]Message, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	msgs, err := inTx(ctx, db, func(tx *sql.Tx) ([]Message, error) { return ls.takeOver(ctx, tx, token, n, alone, lease) })
	ls.giveBackBatch(ctx, db, token.String(), err, false) // see orphan.go
	return msgs, err
}

// takeOver claims again, under claim token, the first batch whose lease
// ran out or that was released, if its messages fit in n (or whatever its
// size when alone), and moves the store's low-water mark past finished
// batches.
func (ls *logStore) takeOver(ctx context.Context, tx *sql.Tx, token uuid.UUID, n int, alone bool, lease time.Duration) (msgs []Message, err error) {
	if err := ls.lockClaims(ctx, tx); err != nil {
		return nil, err
	}
	ls.mu.Lock()
	low := ls.low
	ls.mu.Unlock()
	cand, err := ls.unfinished(ctx, tx, n, alone)
	if err != nil || cand == nil {
		return nil, err
	}
	b := *cand
	b.gen++
	ref := batchRef{batch: b.id, gen: b.gen, token: token}
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
	var rs *sql.Rows
	if b.lastTx == "0" { // a part of an ordered table's window, in ord
		rs, err = tx.QueryContext(ctx, ls.reclaimOrdSQL, b.id, b.lo, b.hi, b.afterSeq, b.lastSeq, low)
	} else {
		rs, err = tx.QueryContext(ctx, ls.reclaimSQL, b.id, b.lo, b.hi, b.afterTx, b.afterSeq, b.lastTx, b.lastSeq, low)
	}
	if err != nil {
		return nil, err
	}
	msgs, blocked, err := scanLogMessages(rs, ref)
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil // settled meanwhile
	}
	b.n = len(msgs)
	if msgs, err = ls.insertBatch(ctx, tx, b, token.String(), lease, msgs); err != nil {
		return nil, err
	}
	return ls.setAside(ctx, tx, ref, msgs, blocked, false)
}

// unfinished reads the latest gen of each batch from the store's
// low-water mark on, moves the mark past the finished ones, and returns
// the first batch that may be taken over (its lease ran out or it was
// released) if its remaining messages fit in n, or whatever their number
// when alone.
//
// It needs no lock: batch ids are given out under the claim lock, one
// after the other, so a batch that q cannot see yet (its claim has not
// committed) has a higher id than every batch it sees, and a batch it
// sees finished stays so. A take-over it cannot see yet (a later gen)
// only makes it return a batch that is no longer due: a take-over reads
// again under the lock.
func (ls *logStore) unfinished(ctx context.Context, q rowsQuerier, n int, alone bool) (*batchRow, error) {
	ls.mu.Lock()
	low := ls.low
	ls.mu.Unlock()
	rows, err := q.QueryContext(ctx, ls.unfinishedSQL, low)
	if err != nil {
		return nil, err
	}
	var (
		cand    *batchRow
		newLow  int64 = -1
		lastID  int64
		scanned int
		server  string
	)
	for rows.Next() {
		var (
			b    batchRow
			due  bool
			done int
		)
		if err := rows.Scan(&b.id, &b.gen, &b.n, &b.lo, &b.hi, &b.afterTx, &b.afterSeq, &b.lastTx, &b.lastSeq, &b.more, &due, &done, &server); err != nil {
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
	if scanned == 0 && low > 0 {
		// Nothing from low on: if the batch ids begun again below it (the
		// table was emptied), start again from 0.
		var latest int64
		if err := q.QueryRowContext(ctx, `SELECT coalesce(max(batch_id), 0) FROM `+ls.l.batch).Scan(&latest); err != nil {
			return nil, err
		}
		if latest < low {
			ls.mu.Lock()
			ls.low = 0
			ls.mu.Unlock()
			return nil, nil // the next look starts from 0
		}
	}
	ls.mu.Lock()
	if scanned > 0 && server != ls.server {
		// Another server than the one low was learnt from: after a
		// failover, the new primary may have lost the tail of the old
		// one's WAL, and with it the settles that finished batches below
		// low (a message whose failure was recorded there would never be
		// taken again). What was learnt before counts no more: the next
		// look reads from the first batch.
		first := ls.server == ""
		ls.server = server
		if !first && low > 0 {
			ls.low = 0
			ls.mu.Unlock()
			ls.scanSoon()
			return nil, nil
		}
	}
	switch {
	case newLow >= 0:
		ls.low = max(ls.low, newLow)
	case scanned > 0:
		ls.low = max(ls.low, lastID)
	}
	ls.mu.Unlock()
	return cand, nil
}
