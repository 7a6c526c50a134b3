package pglog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgsql"
)

// Settle records what became of messages of one claim: for a batch, a
// settle of kind 'p' (published) or 'r' (released), fenced by its gen and
// token (a batch taken over meanwhile is left alone); for messages taken
// from the failed table, the update of their rows that still carry the
// claim.
func (b *Backend) Settle(ctx context.Context, db *sql.DB, published bool, bc backend.Claim, refs []backend.Ref, _ bool) ([]int, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	var (
		done []int
		err  error
	)
	switch c := bc.(type) {
	case BatchClaim:
		done, err = b.settleBatch(ctx, db, published, c, refs)
	case FailedClaim:
		done, err = b.settleFailed(ctx, db, published, c, refs)
		// On an ordered table the next messages of their keys may wait
		// in the failed table behind them (a key with a backlog).
		b.failedSoon()
	default:
		return nil, nil // claimed from a table of another kind: lost
	}
	if !published {
		b.scanSoon()
		b.failedSoon()
	}
	return done, err
}

func (b *Backend) settleBatch(ctx context.Context, db *sql.DB, published bool, c BatchClaim, refs []backend.Ref) ([]int, error) {
	kind := "r"
	if published {
		kind = "p"
	}
	seqs := make([]int64, len(refs))
	for i, r := range refs {
		seqs[i] = r.Seq
	}
	res, err := db.ExecContext(ctx, b.q.settle, c.Batch, c.Gen, kind, seqs, c.Token.String())
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil || n != 1 {
		return nil, err
	}
	done := make([]int, len(refs))
	for i := range done {
		done[i] = i
	}
	return done, nil
}

func (b *Backend) settleFailed(ctx context.Context, db *sql.DB, published bool, c FailedClaim, refs []backend.Ref) ([]int, error) {
	query := b.q.settleFailed
	if !published {
		query = b.q.releaseFailedIDs
	}
	rows, err := db.QueryContext(ctx, query, pgsql.IDs(refs), uuid.UUID(c).String())
	if err != nil {
		return nil, err
	}
	return pgsql.ScanDone(rows, refs)
}

// Fail counts a failed attempt: a message of a batch is copied to the
// failed table (its batch records it as failed), one taken from the failed
// table has its row updated; both back off, and park at maxAttempts.
func (b *Backend) Fail(ctx context.Context, db *sql.DB, ref backend.Ref, bc backend.Claim, reason string, delay time.Duration, maxAttempts int, _ bool) (backend.Failure, bool, error) {
	var (
		f   backend.Failure
		err error
	)
	switch c := bc.(type) {
	case FailedClaim:
		err = db.QueryRowContext(ctx, b.q.refail, ref.ID, uuid.UUID(c).String(), reason, delay.Microseconds(), maxAttempts).Scan(&f.Attempts, &f.Parked)
	case BatchClaim:
		err = db.QueryRowContext(ctx, b.q.fail, c.Batch, c.Gen, ref.Seq, ref.ID, reason, delay.Microseconds(), maxAttempts,
			c.Token.String()).Scan(&f.Attempts, &f.Parked)
	default:
		return f, false, nil // claimed from a table of another kind
	}
	if errors.Is(err, sql.ErrNoRows) {
		return f, false, nil
	}
	if err != nil {
		return f, false, err
	}
	b.failedSoon()
	return f, true, nil
}

// GiveBack gives back what claim took: a batch is released (the next
// claim takes it over), messages of the failed table have their claim
// cleared.
func (b *Backend) GiveBack(ctx context.Context, db *sql.DB, bc backend.Claim) (int64, error) {
	var (
		query, token string
		soon         func() // the look that takes what it gave back
	)
	switch c := bc.(type) {
	case BatchClaim:
		query, token, soon = b.q.releaseBatch, c.Token.String(), b.scanSoon
	case FailedClaim:
		query, token, soon = b.q.releaseFailed, uuid.UUID(c).String(), b.failedSoon
	default:
		return 0, fmt.Errorf("pglog: a claim of %s given back to a table of the log layout", bc.Backend())
	}
	res, err := db.ExecContext(ctx, query, token)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err == nil && n > 0 {
		soon()
	}
	return n, err
}

// giveBack gives back c after a step of a claim failed with err (see
// backend.GiveBack).
func (b *Backend) giveBack(ctx context.Context, db *sql.DB, c backend.Claim, err error, committed bool) {
	backend.GiveBack(ctx, b.cfg.Logger, b.t.Full, func(ctx context.Context) (int64, error) { return b.GiveBack(ctx, db, c) }, err, committed)
}
