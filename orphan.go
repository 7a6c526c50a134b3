package outbox

import (
	"context"

	"github.com/acemq/outbox/internal/backend"
)

// A claim whose caller gets an error may have committed all the same; the
// backend that made it gives back at once what carries its claim (see
// package backend, GiveBack), rather than leave it to its lease.

// giveBack is backend.GiveBack for the store's table.
func (s *Store) giveBack(ctx context.Context, release func(context.Context) (int64, error), err error, committed bool) bool {
	return backend.GiveBack(ctx, s.logger, s.t.full, release, err, committed)
}
