package pglog

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
)

// Taking over a batch: a relay's lease on it ran out, or it released it.
// The batch is claimed again under its next gen, and the marks of the old
// gen are fenced by it (notTakenOver).

// takeOverTx is takeOver in a transaction of its own.
func (b *Backend) takeOverTx(ctx context.Context, db *sql.DB, n int, alone bool, lease time.Duration, ordered bool) ([]backend.Row, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	rows, err := inTx(ctx, db, func(tx *sql.Tx) ([]backend.Row, error) { return b.takeOver(ctx, tx, token, n, alone, lease, ordered) })
	b.giveBack(ctx, db, BatchClaim{Token: token}, err, false)
	return rows, err
}

// takeOver claims again, under claim token, the first batch whose lease
// ran out or that was released, if its messages fit in n (or whatever its
// size when alone), and moves the backend's low-water mark past finished
// batches.
func (b *Backend) takeOver(ctx context.Context, tx *sql.Tx, token uuid.UUID, n int, alone bool, lease time.Duration, ordered bool) ([]backend.Row, error) {
	if _, err := tx.ExecContext(ctx, b.q.lockClaims); err != nil {
		return nil, err
	}
	low := b.lowMark()
	cand, err := b.unfinished(ctx, tx, n, alone)
	if err != nil || cand == nil {
		return nil, err
	}
	br := *cand
	br.gen++
	c := BatchClaim{Batch: br.id, Gen: br.gen, Token: token}
	// A mark of the batch's old generation is fenced by a snapshot ("no
	// later gen"): one already running when this take-over read the
	// settles would pass the fence and commit, and its messages would be
	// published again. The settle table's SHARE lock waits for the marks
	// in flight (the reclaim below then sees them) and holds new ones
	// until this commits (they then see the new generation and find their
	// lease lost).
	if _, err := tx.ExecContext(ctx, "LOCK TABLE "+b.t.Settle+" IN SHARE MODE"); err != nil {
		return nil, err
	}
	var rs *sql.Rows
	if br.lastTx == "0" { // a part of an ordered table's window, in ord
		rs, err = tx.QueryContext(ctx, b.q.reclaimOrd, br.id, br.lo, br.hi, br.afterSeq, br.lastSeq, low)
	} else {
		rs, err = tx.QueryContext(ctx, b.q.reclaim, br.id, br.lo, br.hi, br.afterTx, br.afterSeq, br.lastTx, br.lastSeq, low)
	}
	if err != nil {
		return nil, err
	}
	rows, blockedAt, err := b.scan(rs, c)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil // settled meanwhile
	}
	br.n = len(rows)
	if err := b.insertBatch(ctx, tx, br, token.String(), lease, rows); err != nil {
		return nil, err
	}
	return b.setAside(ctx, tx, c, rows, blockedAt, ordered)
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
func (b *Backend) unfinished(ctx context.Context, q rowsQuerier, n int, alone bool) (*batchRow, error) {
	b.mu.Lock()
	low := b.low
	b.mu.Unlock()
	rows, err := q.QueryContext(ctx, b.q.unfinished, low)
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
			br   batchRow
			due  bool
			done int
		)
		if err := rows.Scan(&br.id, &br.gen, &br.n, &br.lo, &br.hi, &br.afterTx, &br.afterSeq, &br.lastTx, &br.lastSeq, &br.more, &due, &done, &server); err != nil {
			rows.Close()
			return nil, err
		}
		scanned++
		lastID = br.id
		if done >= br.n {
			continue
		}
		if newLow < 0 {
			newLow = br.id
		}
		if due && cand == nil && (br.n-done <= n || alone) {
			cand = &br
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
		if err := q.QueryRowContext(ctx, b.q.latestBatch).Scan(&latest); err != nil {
			return nil, err
		}
		if latest < low {
			b.mu.Lock()
			b.low = 0
			b.mu.Unlock()
			return nil, nil // the next look starts from 0
		}
	}
	b.mu.Lock()
	if scanned > 0 && server != b.server {
		// Another server than the one low was learnt from: after a
		// failover, the new primary may have lost the tail of the old
		// one's WAL, and with it the settles that finished batches below
		// low (a message whose failure was recorded there would never be
		// taken again). What was learnt before counts no more: the next
		// look reads from the first batch.
		first := b.server == ""
		b.server = server
		if !first && low > 0 {
			b.low = 0
			b.mu.Unlock()
			b.scanSoon()
			return nil, nil
		}
	}
	switch {
	case newLow >= 0:
		b.low = max(b.low, newLow)
	case scanned > 0:
		b.low = max(b.low, lastID)
	}
	b.mu.Unlock()
	return cand, nil
}
