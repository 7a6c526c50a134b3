package pglog

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
)

// How a table of the log layout hands out its events: see the package
// doc. Claims of a table are serialised by a transaction-scoped advisory
// lock (Table.LockKey); nothing here updates a row of the events or the
// batch and settle tables.

// claimPresize bounds the room a claim makes for its messages before it
// reads them: a batch of the default size is read without growing it, and
// a claim with a large BatchSize that finds little does not hold room for
// all of it.
const claimPresize = 128

// Claim takes, in this order, failed messages due again and a batch to
// take over (when a look found them, see looks.go), then the next part of
// the current window (or the next window). The rows it returns carry
// their claim (a FailedClaim or a BatchClaim); a row that cannot be
// relayed as written is parked by the claim of a batch itself and
// returned with Parked set, one taken from the failed table is returned
// with Unfit set for the store to park (Fail). When it fails, what it had
// taken is given back (or left to its lease when the server reported the
// failure), and no claim is returned with the error.
func (b *Backend) Claim(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, ordered bool) ([]backend.Row, backend.Claim, error) {
	var rows []backend.Row
	step := func(take func() ([]backend.Row, error)) error {
		more, err := take()
		if len(rows) == 0 {
			rows = more // mostly the only step: no copy
		} else {
			rows = append(rows, more...)
		}
		return err
	}
	tended := b.tended()
	err := func() error {
		if b.lookNow(&b.failedNow, &b.nextFailed, tended) {
			if err := step(func() ([]backend.Row, error) { return b.claimFailed(ctx, db, n, lease, ordered) }); err != nil {
				return err
			}
		}
		if len(rows) < n && b.lookNow(&b.scanNow, &b.nextScan, tended) {
			if err := step(func() ([]backend.Row, error) {
				return b.takeOverTx(ctx, db, n-len(rows), len(rows) == 0, lease, ordered)
			}); err != nil {
				return err
			}
		}
		if len(rows) < n {
			return step(func() ([]backend.Row, error) { return b.claimNew(ctx, db, n-len(rows), lease, maxBytes, ordered) })
		}
		return nil
	}()
	if err != nil && len(rows) == 0 {
		return nil, nil, err
	}
	b.lookedFor(len(rows) == 0, lease)
	// Messages already claimed are returned even if a later step failed:
	// the next claim meets the failure again.
	if !tended && b.due(&b.nextRotate, rotateEvery) {
		if err := b.rotateAll(ctx, db); err != nil && ctx.Err() == nil {
			b.cfg.Logger.WarnContext(ctx, "outbox: Rotating the partitions of a log table failed; trying again in a second",
				slog.String("table", b.t.Full), slog.Any("error", err))
		}
	}
	var c backend.Claim
	if len(rows) > 0 {
		c = rows[len(rows)-1].Claim
	}
	return rows, c, nil
}

func (b *Backend) claimFailed(ctx context.Context, db *sql.DB, n int, lease time.Duration, ordered bool) (rows []backend.Row, err error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	defer func() { b.giveBack(ctx, db, FailedClaim(token), err, false) }()
	c := FailedClaim(token)
	if !ordered {
		rs, err := db.QueryContext(ctx, b.q.failedClaim, n, token.String(), lease.Microseconds())
		if err != nil {
			return nil, err
		}
		rows, _, err := b.scan(rs, c)
		return rows, err
	}
	return inTx(ctx, db, func(tx *sql.Tx) ([]backend.Row, error) {
		if _, err := tx.ExecContext(ctx, b.q.lockClaims); err != nil {
			return nil, err
		}
		rs, err := tx.QueryContext(ctx, b.q.failedClaimOrd, n, token.String(), lease.Microseconds(), b.lowMark())
		if err != nil {
			return nil, err
		}
		rows, _, err := b.scan(rs, c)
		slices.SortFunc(rows, func(a, b backend.Row) int { return cmp.Or(cmp.Compare(a.Ord, b.Ord), cmp.Compare(a.Seq, b.Seq)) })
		return rows, err
	})
}

// lowMark is the low-water mark of unfinished batches.
func (b *Backend) lowMark() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.low
}

// scan reads the message columns (those of a failed table's rows: the
// columns, attempts, last error, claimed_until, parked_at), then ord and
// whether the message's key is blocked (see blocked), each with claim,
// and returns the indices of the blocked ones. A row that cannot be read
// as written is returned with Unfit set; one whose id cannot be read
// either is a backend.BadRowError.
func (b *Backend) scan(rs *sql.Rows, claim backend.Claim) (rows []backend.Row, blockedAt []int, err error) {
	defer rs.Close()
	for rs.Next() {
		var (
			r                 backend.Row
			claimed, parkedAt sql.NullTime
			ord               sql.NullInt64
			blocked           bool
		)
		if err := rs.Scan(&r.ID, &r.Seq, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &r.Headers,
			&r.CreatedAt, &r.Attempts, &r.LastError, &claimed, &parkedAt, &ord, &blocked); err != nil {
			if r.ID == "" {
				return nil, nil, backend.BadRowError{Err: err}
			}
			r.Unfit, r.Headers = err.Error(), nil
		}
		r.ClaimedUntil, r.ParkedAt, r.Ord, r.Claim = claimed.Time, parkedAt.Time, ord.Int64, claim
		if blocked {
			blockedAt = append(blockedAt, len(rows))
		}
		rows = append(rows, r)
	}
	return rows, blockedAt, rs.Err()
}

// inTx runs f in a transaction, committed when f succeeds; what f took
// is returned only then.
func inTx(ctx context.Context, db *sql.DB, f func(tx *sql.Tx) ([]backend.Row, error)) ([]backend.Row, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	rows, err := f(tx)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return rows, nil
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// rowsQuerier is a *sql.DB or a *sql.Tx.
type rowsQuerier interface {
	querier
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// claimNew takes the next part of the current window, or opens the next
// window when the current one is drained (the table's claim function). On
// an ordered table it stops before a message whose key an unfinished batch
// holds, and sets aside the messages of blocked keys (divert).
func (b *Backend) claimNew(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, ordered bool) (_ []backend.Row, err error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, err
	}
	committed := false // the claim did: what fails after it leaves its batch behind
	defer func() { b.giveBack(ctx, db, BatchClaim{Token: token}, err, committed) }()
	rs, err := db.QueryContext(ctx, b.q.claim, n, lease.Microseconds(), maxBytes, token.String(), b.lowMark())
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var (
		rows      = make([]backend.Row, 0, min(n, claimPresize))
		blockedAt []int
		batch     int64
		found     bool // the claim function found the table ordered
		tx        sql.RawBytes
	)
	for rs.Next() {
		var (
			r       backend.Row
			ord     sql.NullInt64
			blocked bool
		)
		if err := rs.Scan(&batch, &r.ClaimedUntil, &r.ID, &r.Seq, &tx, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload,
			&r.ContentType, &r.Headers, &r.CreatedAt, &ord, &blocked, &found); err != nil {
			if r.ID == "" {
				return nil, backend.BadRowError{Err: err}
			}
			r.Unfit, r.Headers = err.Error(), nil // parked below, with its batch
		}
		r.Ord = ord.Int64
		if blocked {
			blockedAt = append(blockedAt, len(rows))
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	committed = true
	c := BatchClaim{Batch: batch, Token: token, Ordered: found && !ordered}
	for i := range rows {
		rows[i].Claim = c
	}
	// What it could not set aside is set aside by whoever takes the
	// batch over after its lease: nothing of it is published meanwhile.
	return b.setAside(ctx, db, c, rows, blockedAt, ordered || found)
}

// setAside parks the messages of batch c that cannot be relayed as
// written (parkUnfit: its batch records them as failed, fenced like a
// mark by its gen) and sets aside those whose key is blocked (divert), on
// an ordered table with them the later messages of a parked one's key;
// it returns the others, and the parked ones with Parked set, first.
func (b *Backend) setAside(ctx context.Context, q execer, c BatchClaim, rows []backend.Row, blockedAt []int, ordered bool) ([]backend.Row, error) {
	for i := range rows {
		if rows[i].Unfit == "" {
			rows[i].Unfit = b.cfg.Unfit(rows[i].ID, rows[i].Headers)
		}
	}
	if slices.IndexFunc(rows, func(r backend.Row) bool { return r.Unfit != "" }) < 0 {
		return b.divert(ctx, q, c, rows, blockedAt)
	}
	var (
		kept, parked []backend.Row
		keep         []int
		seqs         []int64
		ids, reason  []string
		keys         = map[string]bool{}
	)
	for i, r := range rows {
		switch {
		case r.Unfit != "":
			r.LastError, r.Attempts, r.Parked = backend.UnfitReason(r.Unfit), 1, true
			seqs, ids, reason = append(seqs, r.Seq), append(ids, r.ID), append(reason, r.LastError)
			parked = append(parked, r)
			if ordered && r.Key != "" {
				keys[r.Key] = true
			}
			continue
		case slices.Contains(blockedAt, i) || keys[r.Key]:
			keep = append(keep, len(kept))
		}
		kept = append(kept, r)
	}
	if _, err := q.ExecContext(ctx, b.q.parkUnfit, c.Batch, c.Gen, seqs, ids, reason, c.Token.String()); err != nil {
		return nil, fmt.Errorf("parking %d message(s) that cannot be relayed as written: %w", len(ids), err)
	}
	b.failedSoon()
	kept, err := b.divert(ctx, q, c, kept, keep)
	if err != nil {
		return nil, err
	}
	return append(parked, kept...), nil
}

// divert sets aside the messages at blockedAt of rows, which batch c
// took: on an ordered table, a message whose key has a message in the
// failed table waits there behind it (attempts 0, due at once), and its
// batch records it as failed; the others are returned. A batch taken over
// meanwhile is left alone (the messages are another relay's).
func (b *Backend) divert(ctx context.Context, q execer, c BatchClaim, rows []backend.Row, blockedAt []int) ([]backend.Row, error) {
	if len(blockedAt) == 0 {
		return rows, nil
	}
	seqs := make([]int64, len(blockedAt))
	ids := make([]string, len(blockedAt))
	for i, j := range blockedAt {
		seqs[i], ids[i] = rows[j].Seq, rows[j].ID
	}
	if _, err := q.ExecContext(ctx, b.q.divert, c.Batch, c.Gen, seqs, ids, c.Token.String()); err != nil {
		return nil, fmt.Errorf("setting aside %d message(s) behind a failed message of their key: %w", len(blockedAt), err)
	}
	kept := make([]backend.Row, 0, len(rows)-len(blockedAt))
	for i, j := 0, 0; i < len(rows); i++ {
		if j < len(blockedAt) && blockedAt[j] == i {
			j++
			continue
		}
		kept = append(kept, rows[i])
	}
	b.failedSoon()
	return kept, nil
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

// insertBatch records the batch of rows and sets their lease.
func (b *Backend) insertBatch(ctx context.Context, tx *sql.Tx, br batchRow, token string, lease time.Duration, rows []backend.Row) error {
	var until time.Time
	// Its keys, which ordered claims keep out of other batches while it is
	// unfinished.
	keys := []string{}
	seen := map[string]bool{}
	for _, r := range rows {
		if r.Key != "" && !seen[r.Key] {
			seen[r.Key] = true
			keys = append(keys, r.Key)
		}
	}
	err := tx.QueryRowContext(ctx, b.q.insertBatch, br.id, br.gen, br.lo, br.hi, br.afterTx, br.afterSeq, br.lastTx, br.lastSeq, br.n, br.more,
		token, lease.Microseconds(), keys).Scan(&until)
	if err != nil {
		return err
	}
	for i := range rows {
		rows[i].ClaimedUntil = until
	}
	return nil
}
