package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/dberr"
)

// A claim whose caller gets an error may have committed all the same: its
// context ended, or its connection was lost, while or after the server
// committed it. Nobody publishes what it took, and until its lease ends
// nobody else claims it either: after a dropped connection a relay's batch
// (and, on an ordered table, the keys in it) would wait out the whole
// lease. So a failed claim gives back at once whatever carries its claim
// token, which the client makes before it claims. Giving back a claim that
// did not commit changes nothing.
//
// It is best-effort: when the database cannot be reached the messages wait
// for their lease as before, and a claim cut off while the server is still
// running it may commit after the give-back has looked. Neither loses a
// message.

// giveBackTimeout bounds giving back a failed claim, on a context of
// its own (the claim's may have ended): it is one short statement.
const giveBackTimeout = 2 * time.Second

// keepClaim says that a claim that failed with err is not to be given
// back: the server reported the failure of the statement or transaction
// that would have committed it (nothing was taken), or a row it took could
// not be read (badRowError), which the next claim would take again first,
// failing the same way and holding up every message behind it; its lease
// keeps it aside instead, and the claims after it take the others.
func keepClaim(err error) bool {
	return dberr.Database(err) != "" || errors.As(err, new(badRowError)) || errors.As(err, new(backend.BadRowError))
}

// badRowError is the failure to read a claimed row: a column that does not
// scan, headers that do not decode (a row written by hand, say).
type badRowError struct{ err error }

func (e badRowError) Error() string { return e.err.Error() }
func (e badRowError) Unwrap() error { return e.err }

// giveBack runs release, which gives back what a claim took and returns
// how many messages it changed, after the claim failed with err (what the
// caller saw), unless keepClaim(err) says not to or, with committed,
// whatever err says (the claim committed and its rows were read before
// err). It reports whether it gave anything back. Errors are logged, not
// returned: the claim's error is the one the caller needs.
func (s *Store) giveBack(ctx context.Context, release func(context.Context) (int64, error), err error, committed bool) bool {
	if err == nil || (!committed && keepClaim(err)) {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	n, rerr := release(rctx)
	switch {
	case rerr != nil:
		s.logger.DebugContext(ctx, "outbox: A claim failed and what it may have taken could not be given back at once; it is claimed again when its lease ends",
			slog.String("table", s.t.full), slog.Any("claim_error", err), slog.Any("error", rerr))
		return false
	case n > 0:
		s.logger.InfoContext(ctx, "outbox: A claim failed after it had taken messages; they were given back, to be claimed again at once",
			slog.String("table", s.t.full), slog.Int64("rows", n), slog.Any("claim_error", err))
		return true
	}
	return false
}

// execGiveBack is a give-back of one statement, bound to token.
func execGiveBack(db *sql.DB, query, token string) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		res, err := db.ExecContext(ctx, query, token)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
}

// releaseLogBatchSQL gives back the batch of a log table that claim token
// $1 took (its first gen or a take-over's), as the relay releases one: a
// settle of kind r, after which the next claim takes the batch over.
const releaseLogBatchSQL = `INSERT INTO {settle} (batch_id, gen, kind, seqs)
SELECT b.batch_id, b.gen, 'r', '{}'::bigint[] FROM {batch} AS b
WHERE b.token = $1::uuid AND NOT EXISTS (SELECT 1 FROM {batch} AS l WHERE l.batch_id = b.batch_id AND l.gen > b.gen)`

// releaseLogFailedSQL gives back the messages of a log table's failed
// table that claim token $1 took.
const releaseLogFailedSQL = `UPDATE {failed}
SET claim_token = NULL, claimed_until = NULL
WHERE claim_token = $1::uuid AND published_at IS NULL`

// giveBackBatch is giveBack for the batch of a log table that claim token
// took: the next claim takes it over.
func (ls *logStore) giveBackBatch(ctx context.Context, db *sql.DB, token string, err error, committed bool) {
	if ls.s.giveBack(ctx, execGiveBack(db, ls.releaseBatchSQL, token), err, committed) {
		ls.scanSoon()
	}
}
