package outbox

import (
	"context"
	"errors"

	"github.com/acemq/outbox/internal/backend"
)

// A claim whose caller gets an error may have committed all the same; the
// backend that made it gives back at once what carries its claim (see
// package backend, GiveBack), rather than leave it to its lease.

// keepClaim is backend.KeepClaim, and keeps a claim whose row this
// package could not read (badRowError) too.
func keepClaim(err error) bool {
	return backend.KeepClaim(err) || errors.As(err, new(badRowError))
}

// badRowError is the failure to read a claimed row: a column that does not
// scan, headers that do not decode (a row written by hand, say).
type badRowError struct{ err error }

func (e badRowError) Error() string { return e.err.Error() }
func (e badRowError) Unwrap() error { return e.err }

// giveBack is backend.GiveBack for the store's table, with keepClaim.
func (s *Store) giveBack(ctx context.Context, release func(context.Context) (int64, error), err error, committed bool) bool {
	if err == nil || (!committed && keepClaim(err)) {
		return false
	}
	return backend.GiveBack(ctx, s.logger, s.t.full, release, err, true)
}
