package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// BenchmarkMySQLCountsWithHistory reads what operators and metrics read
// (Pending, Stats, Gauges) on a MySQL/MariaDB table of 1,000 pending
// messages, without and with OUTBOX_BENCH_HISTORY (default 1,000,000)
// published rows beside them (issue 41: "pending count cheap at 10 M
// rows"). The counts walk state_idx from published_at IS NULL, so the
// history should not show.
func BenchmarkMySQLCountsWithHistory(b *testing.B) {
	ctx := context.Background()
	history := dbtest.EnvInt(b, "OUTBOX_BENCH_HISTORY", 1_000_000)
	for _, published := range []int{0, history} {
		db := mysqltest.DB(b) // a database of its own: the table is outbox
		store, err := outbox.NewStore(db, nil)
		require.NoError(b, err)
		require.NoError(b, store.CreateSchemaIfAbsent(ctx))
		// Ten digits joined n times make the rows, on MySQL and MariaDB
		// alike, a million a statement.
		const digits = `(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
			UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
		for left := published; left > 0; left -= 1_000_000 {
			_, err := db.ExecContext(ctx, `INSERT INTO outbox (id, event_type, payload, headers, created_at, published_at)
				SELECT UUID(), 'old.event', '{}', '{}', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR
				FROM `+digits+` a, `+digits+` b, `+digits+` c, `+digits+` d, `+digits+` e, `+digits+` f LIMIT ?`, min(left, 1_000_000))
			require.NoError(b, err)
		}
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(b, err)
		require.NoError(b, store.Add(ctx, tx, events(1000)...))
		require.NoError(b, tx.Commit())
		_, err = db.ExecContext(ctx, `ANALYZE TABLE outbox`)
		require.NoError(b, err)
		var rows int
		require.NoError(b, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox`).Scan(&rows))
		require.Equal(b, published+1000, rows)

		for _, read := range []struct {
			name string
			f    func() (int64, error)
		}{
			{"Pending", func() (int64, error) { return store.Pending(ctx) }},
			{"Stats", func() (int64, error) { st, err := store.Stats(ctx); return st.Pending, err }},
			{"Gauges", func() (int64, error) { g, err := store.Gauges(ctx, 0); return g.Pending, err }},
		} {
			b.Run(fmt.Sprintf("%s/published=%d", read.name, published), func(b *testing.B) {
				for range b.N {
					n, err := read.f()
					if err != nil {
						b.Fatal(err)
					}
					if n != 1000 {
						b.Fatalf("%s: %d pending, want 1000", read.name, n)
					}
				}
			})
		}
	}
}
