package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkOrderedClaim is the claim curve of issue 21, item 2: one claim
// of a whole batch in ordered mode, by batch size, for messages of one key
// and of 10,000 keys (and unordered, for scale), on both layouts. ns/op is
// one claim; the table holds the batch's messages and nothing else.
func BenchmarkOrderedClaim(b *testing.B) {
	ctx := context.Background()
	db := dbtest.DB(b)
	for _, c := range []struct {
		keys    int
		ordered bool
		log     bool
	}{{1, true, false}, {10000, true, false}, {10000, false, false}, {1, true, true}, {10000, true, true}, {10000, false, true}} {
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(b), Ordering: map[bool]outbox.Ordering{true: outbox.OrderedByKey}[c.ordered]})
		require.NoError(b, err)
		truncate := `TRUNCATE "` + store.Table() + `"`
		if c.log {
			require.NoError(b, store.CreateLogSchemaIfAbsent(ctx))
			truncate = fmt.Sprintf(`TRUNCATE "%[1]s", "%[1]s_batch", "%[1]s_settle", "%[1]s_failed"`, store.Table())
		} else {
			require.NoError(b, store.CreateRowsSchemaIfAbsent(ctx))
		}
		for _, batch := range []int{100, 1000, 2500, 5000, 20000} {
			name := fmt.Sprintf("keys=%d/batch=%d", c.keys, batch)
			if !c.ordered {
				name = "unordered/" + name
			}
			if c.log {
				name = "log/" + name
			}
			b.Run(name, func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					_, err := db.ExecContext(ctx, truncate) // no dead index entries left behind: the curve is the claim's
					require.NoError(b, err)
					evts := make([]outbox.Event, batch)
					for i := range evts {
						evts[i] = outbox.Event{Type: "e", Key: fmt.Sprint("k", i%c.keys), Payload: []byte(`{}`)}
					}
					tx, err := db.BeginTx(ctx, nil)
					require.NoError(b, err)
					require.NoError(b, store.Add(ctx, tx, evts...))
					require.NoError(b, tx.Commit())
					_, err = db.ExecContext(ctx, `ANALYZE "`+store.Table()+`"`)
					require.NoError(b, err)
					b.StartTimer()
					msgs, err := store.Claim(ctx, batch, 5*time.Minute)
					b.StopTimer()
					require.NoError(b, err)
					require.Len(b, msgs, batch)
					b.StartTimer()
				}
			})
		}
	}
}
