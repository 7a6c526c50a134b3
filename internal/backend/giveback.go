package backend

import (
	"context"
	"errors"
	"log/slog"
	"time"

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

// KeepClaim says that a claim that failed with err is not to be given
// back: the server reported the failure of the statement or transaction
// that would have committed it (nothing was taken), or a row it took could
// not be read (BadRowError), which the next claim would take again first,
// failing the same way and holding up every message behind it; its lease
// keeps it aside instead, and the claims after it take the others.
func KeepClaim(err error) bool {
	return dberr.Database(err) != "" || errors.As(err, new(BadRowError))
}

// GiveBack runs release, which gives back what a claim of table took and
// returns how many messages it changed, after the claim failed with err
// (what the caller saw), unless KeepClaim(err) says not to or, with
// committed, whatever err says (the claim committed and its rows were
// read before err). It reports whether it gave anything back. Errors are
// logged, not returned: the claim's error is the one the caller needs.
func GiveBack(ctx context.Context, logger *slog.Logger, table string, release func(context.Context) (int64, error), err error, committed bool) bool {
	if err == nil || (!committed && KeepClaim(err)) {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	n, rerr := release(rctx)
	switch {
	case rerr != nil:
		logger.DebugContext(ctx, "outbox: A claim failed and what it may have taken could not be given back at once; it is claimed again when its lease ends",
			slog.String("table", table), slog.Any("claim_error", err), slog.Any("error", rerr))
		return false
	case n > 0:
		logger.InfoContext(ctx, "outbox: A claim failed after it had taken messages; they were given back, to be claimed again at once",
			slog.String("table", table), slog.Int64("rows", n), slog.Any("claim_error", err))
		return true
	}
	return false
}
