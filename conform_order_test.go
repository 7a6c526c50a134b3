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
