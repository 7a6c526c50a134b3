package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/console"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkConsolePages times the server's side of the console's pages
// on a rows-layout table of OUTBOX_BENCH_HISTORY published rows (default
// 1,000,000; the figure is at 10,000,000), published over the
// last seven days, beside OUTBOX_BENCH_PARKED parked ones (default
// 100,000) and 1,000 ready: the overview, the first page of the parked
// list, its hundredth page (by its cursor) and a list filtered by an
// error text that only the oldest parked message has; the table's page
// (its counts, the last hour's chart, the live claims, the blocked keys),
// a key's queue (100 parked messages) and the first page of the delayed
// list (empty).
func BenchmarkConsolePages(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	history := dbtest.EnvInt(b, "OUTBOX_BENCH_HISTORY", 1_000_000)
	parked := dbtest.EnvInt(b, "OUTBOX_BENCH_PARKED", 100_000)
	s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b)})
	require.NoError(b, err)
	require.NoError(b, s.CreateRowsSchemaIfAbsent(ctx))
	q := func(sql string, args ...any) {
		b.Helper()
		_, err := db.ExecContext(ctx, sql, args...)
		require.NoError(b, err)
	}
	t := `"` + s.Table() + `"`
	q(`INSERT INTO `+t+` (id, event_type, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'old.event', '\x7b7d', now() - i * (interval '7 days' / $1), now() - i * (interval '7 days' / $1)
		FROM generate_series(1, $1) AS i`, history)
	q(`INSERT INTO `+t+` (id, event_type, event_key, payload, attempts, last_error, parked_at, created_at)
		SELECT gen_random_uuid(), 'order.' || (i % 7), 'k' || (i % 1000), '\x7b7d', 10,
		       CASE WHEN i = $1 THEN 'the oldest one' ELSE 'NOT_FOUND - no exchange ''x''' END,
		       now() - i * interval '1 second', now() - i * interval '1 second'
		FROM generate_series(1, $1) AS i`, parked)
	q(`INSERT INTO ` + t + ` (id, event_type, payload) SELECT gen_random_uuid(), 'ready', '\x7b7d' FROM generate_series(1, 1000)`)
	q(`VACUUM ANALYZE ` + t)
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}})
	require.NoError(b, err)
	page := func(path string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			b.Fatalf("%s: %d %s", path, rec.Code, rec.Body.String())
		}
	}
	list := "/parked?table=" + url.QueryEscape(s.Table())
	// The hundredth page's cursor: the 99 × PageSize-th parked message.
	var us, seq int64
	require.NoError(b, db.QueryRowContext(ctx, `SELECT (extract(epoch FROM parked_at) * 1000000)::bigint, seq FROM `+t+`
		WHERE parked_at IS NOT NULL ORDER BY parked_at DESC, seq DESC OFFSET $1 LIMIT 1`, 99*console.PageSize-1).Scan(&us, &seq))
	for name, path := range map[string]string{
		"overview":           "/",
		"parked-first-page":  list,
		"parked-100th-page":  list + fmt.Sprintf("&after=%d.%d", us, seq),
		"parked-rare-error":  list + "&error=oldest",
		"parked-type-filter": list + "&type=order.3",
		"table":              "/table?table=" + url.QueryEscape(s.Table()),
		"key-queue":          "/key?table=" + url.QueryEscape(s.Table()) + "&key=k7",
		"delayed-first-page": "/delayed?table=" + url.QueryEscape(s.Table()),
	} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				page(path)
			}
		})
	}
	// Where the table's page spends its time: each of its reads alone.
	for name, read := range map[string]func() error{
		"read-stats":               func() error { _, err := s.Stats(ctx); return err },
		"read-published-by-minute": func() error { _, err := s.PublishedByMinute(ctx, console.ChartMinutes); return err },
		"read-leases":              func() error { _, err := s.Leases(ctx, console.ListMax); return err },
		"read-blocked-keys":        func() error { _, err := s.BlockedKeys(ctx, console.ListMax); return err },
	} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				require.NoError(b, read())
			}
		})
	}
}
