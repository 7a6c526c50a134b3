package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/pgerr"
)

// writerKind is one way of writing into an outbox table: what issue 21
// found breaking the order when one of them skipped the key's turn.
type writerKind struct {
	name  string
	write func(ctx context.Context, tx *sql.Tx, e outbox.Event) error
}

func writerKinds(t *testing.T, table string) []writerKind {
	t.Helper()
	unordered, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: table})
	require.NoError(t, err)
	orderedStore, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: table, Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	return []writerKind{
		{"unordered store", func(ctx context.Context, tx *sql.Tx, e outbox.Event) error { return unordered.Add(ctx, tx, e) }},
		{"ordered store", func(ctx context.Context, tx *sql.Tx, e outbox.Event) error { return orderedStore.Add(ctx, tx, e) }},
		{"raw INSERT", func(ctx context.Context, tx *sql.Tx, e outbox.Event) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`" (id, event_type, event_key, payload) VALUES (gen_random_uuid(), $1, $2, $3)`,
				e.Type, e.Key, e.Payload)
			return err
		}},
	}
}

// Issue 21, item 1: on an ordered table every writer takes the key's turn,
// whatever its configuration: while one transaction holds a key, another
// writer of that key waits (here: gives up after its lock_timeout), and
// a writer of another key does not; on an unordered table nobody waits.
func TestOrderedTableEveryWriterTakesTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	kinds := writerKinds(t, b.table)
	for _, first := range kinds {
		for _, second := range kinds {
			t.Run(first.name+" then "+second.name, func(t *testing.T) {
				key := fmt.Sprintf("k-%s-%s", first.name, second.name)
				txA, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer txA.Rollback() //nolint:errcheck
				require.NoError(t, first.write(ctx, txA, keyed(key, 1)))

				try := func(key string) error {
					tx, err := b.db.BeginTx(ctx, nil)
					require.NoError(t, err)
					defer tx.Rollback() //nolint:errcheck
					_, err = tx.ExecContext(ctx, "SET LOCAL lock_timeout = '100ms'")
					require.NoError(t, err)
					if err := second.write(ctx, tx, keyed(key, 2)); err != nil {
						return err
					}
					return tx.Commit()
				}
				err = try(key)
				require.Error(t, err, "%s wrote key %s while %s held it", second.name, key, first.name)
				require.Equal(t, "55P03", pgerr.State(err), "it waited for the key's turn: %v", err)
				require.NoError(t, try(key+"-other"), "another key does not wait")

				require.NoError(t, txA.Commit())
				require.NoError(t, try(key), "after the commit the key is free")
				var seqs []int64
				rows, err := b.db.QueryContext(ctx, `SELECT seq FROM "`+b.table+`" WHERE event_key = $1 ORDER BY payload`, key)
				require.NoError(t, err)
				for rows.Next() {
					var s int64
					require.NoError(t, rows.Scan(&s))
					seqs = append(seqs, s)
				}
				require.NoError(t, rows.Err())
				require.Len(t, seqs, 2)
				require.Less(t, seqs[0], seqs[1], "numbered in commit order")
			})
		}
	}

	// The same table made unordered: nobody waits.
	_, err := b.store.ConvertOrdering(ctx, outbox.Unordered, false, time.Second)
	require.NoError(t, err)
	txA, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer txA.Rollback() //nolint:errcheck
	require.NoError(t, kinds[2].write(ctx, txA, keyed("free", 1)))
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	_, err = tx.ExecContext(ctx, "SET LOCAL lock_timeout = '100ms'")
	require.NoError(t, err)
	require.NoError(t, kinds[2].write(ctx, tx, keyed("free", 2)))
}

// Issue 21, item 1, under concurrency: an unordered store, a raw INSERT and
// an ordered store write the same keys of an ordered table at once. Each
// transaction, after writing its event, counts the key's commits in a row
// of its own (the row lock makes that count the commit order); ordered
// claims must then hand every key's messages over in that order.
func TestOrderedTableMixedWritersKeepCommitOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, ordered())
	counters := b.table + "_commits"
	_, err := b.db.ExecContext(ctx, `CREATE TABLE "`+counters+`" (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.db.ExecContext(context.Background(), `DROP TABLE "`+counters+`"`) })
	const keys = 8
	for k := range keys {
		_, err := b.db.ExecContext(ctx, `INSERT INTO "`+counters+`" (key) VALUES ($1)`, fmt.Sprint("key-", k))
		require.NoError(t, err)
	}
	kinds := writerKinds(t, b.table)

	const perWriter = 60
	var wg sync.WaitGroup
	errs := make(chan error, 3*2)
	for w := range 3 * 2 {
		kind := kinds[w%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 21))
			for i := range perWriter {
				key := fmt.Sprint("key-", rng.IntN(keys))
				if err := writeCounted(ctx, b.db, kind, b.table, counters, key, fmt.Sprintf("%d-%d", w, i), rng.IntN(10) == 0); err != nil {
					errs <- fmt.Errorf("%s: %w", kind.name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// Claim everything in ordered mode, publishing each batch at once.
	last := map[string]int64{}
	total := 0
	for {
		msgs, err := b.store.Claim(ctx, 50, time.Minute)
		require.NoError(t, err)
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			var v struct{ N int64 }
			require.NoError(t, json.Unmarshal(m.Payload, &v))
			require.Greater(t, v.N, last[m.Key], "key %s: the message of commit %d came after that of commit %d", m.Key, v.N, last[m.Key])
			last[m.Key] = v.N
			total++
		}
		require.NoError(t, b.store.MarkPublished(ctx, msgs...))
	}
	committed := dbtest.Count(t, b.db, `SELECT coalesce(sum(n), 0) FROM "`+counters+`"`)
	require.EqualValues(t, committed, total, "every committed message claimed once")
	require.Greater(t, total, 3*2*perWriter*8/10, "most transactions committed (a tenth roll back)")
}

// writeCounted writes one event of key in a transaction that then counts
// the key's commits; the event's payload carries the count. It rolls back
// instead of committing when rollback is set.
func writeCounted(ctx context.Context, db *sql.DB, kind writerKind, table, counters, key, id string, rollback bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	// The event first, its payload filled in after the count: a writer
	// that skipped the key's turn would draw its seq before it waits for
	// the counter's row.
	if err := kind.write(ctx, tx, outbox.Event{Type: "counted", Key: key, Payload: []byte(`{"id":"` + id + `"}`)}); err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `UPDATE "`+counters+`" SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE "`+table+`" SET payload = convert_to(json_build_object('n', $1::bigint)::text, 'UTF8') WHERE payload = $2`,
		n, []byte(`{"id":"`+id+`"}`)); err != nil {
		return err
	}
	if rollback {
		return nil
	}
	return tx.Commit()
}
