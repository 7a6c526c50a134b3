package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// Issue 40: reading a table's mode (TableOrdering) changes nothing about
// the store that reads it; the store's claims follow the table's mode
// once it learns it from the table (CheckOrdering, which relays run every
// second).
func TestConformTableOrderingOnlyReads(t *testing.T) {
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, _ backendCase) {
		ctx := context.Background()
		other, err := outbox.NewStore(db, &outbox.StoreConfig{Table: s.Table()})
		require.NoError(t, err)
		_, err = other.ConvertOrdering(ctx, outbox.OrderedByKey, false, 5*time.Second)
		require.NoError(t, err)

		o, err := s.TableOrdering(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.OrderedByKey, o)
		require.Equal(t, outbox.Unordered, s.Ordering(), "a read of the table's mode changes nothing")
		require.NoError(t, s.CheckOrdering(ctx))
		require.Equal(t, outbox.OrderedByKey, s.Ordering(), "after CheckOrdering the store follows the table")
	})
}

// Issue 40: a purge deletes only published messages older than its
// cutoff, on every backend: what is pending stays, and stays claimable,
// and Purgeable counts what the purge then deletes. (The log layout
// purges whole partitions, never the one writers are in: a small table's
// published messages stay until their partition is left behind.)
func TestConformPurgeKeepsWhatIsPending(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		addTx(t, db, s, outbox.Event{Type: "published"}, outbox.Event{Type: "published"})
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 2)
		require.NoError(t, s.MarkPublished(ctx, msgs...))
		pending := addTx(t, db, s, outbox.Event{Type: "pending"})

		want, err := s.Purgeable(ctx, 0)
		require.NoError(t, err)
		n, err := s.PurgePublished(ctx, 0)
		require.NoError(t, err)
		require.Equal(t, want, n, "Purgeable counts what the purge deletes")
		if !b.log {
			require.EqualValues(t, 2, n, "the published messages are deleted")
		}
		p, err := s.Pending(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, p, "the pending message stays")
		msgs, err = s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, pending[0], msgs[0].ID)
	})
}
