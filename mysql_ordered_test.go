package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// orderedMySQL returns an ordered store on a table of its own on MariaDB.
func orderedMySQL(t *testing.T, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store) {
	t.Helper()
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Ordering = outbox.OrderedByKey
	db, s := mysqlStore(t, cfg)
	o, err := s.TableOrdering(context.Background())
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, o, "CreateSchemaIfAbsent of an ordered store makes the table ordered")
	require.NoError(t, s.CheckOrdering(context.Background()))
	return db, s
}

// Issue 41: on an ordered MySQL table the writers of a key take turns,
// whatever program writes: a second transaction writing the key waits
// for the first to end, and takes its place after it, through the
// store or by a plain INSERT.
func TestMySQLOrderedWritersTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := orderedMySQL(t, nil)

	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback() //nolint:errcheck // ended below
	require.NoError(t, s.Add(ctx, first, outbox.Event{ID: "0190b4a2-7c3e-7000-8000-000000000001", Type: "a", Key: "k"}))

	done := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(ctx, nil)
		if err == nil {
			// A plain INSERT, as another program would write.
			_, err = tx.ExecContext(ctx, `INSERT INTO outbox (id, event_type, event_key, payload, headers) VALUES ('0190b4a2-7c3e-7000-8000-000000000002', 'b', 'k', '', '{}')`)
			if err == nil {
				err = tx.Commit()
			}
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			t.Fatalf("the second writer did not wait: %v", err)
		default:
		}
		var waits int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'`).Scan(&waits))
		return waits > 0
		// INNODB_TRX is a cache that a read within 0.1s of the last one
		// does not refresh: look less often than that.
	}, 10*time.Second, 150*time.Millisecond, "the second writer waits for the key's turn")
	select {
	case err := <-done:
		t.Fatalf("the second writer did not wait: %v", err)
	default:
	}
	require.NoError(t, first.Commit())
	require.NoError(t, <-done)

	rows, err := db.Query(`SELECT id, ord FROM outbox ORDER BY ord`)
	require.NoError(t, err)
	defer rows.Close()
	var got []string
	for rows.Next() {
		var (
			id  string
			ord int64
		)
		require.NoError(t, rows.Scan(&id, &ord))
		got = append(got, fmt.Sprint(id[len(id)-1:], ":", ord))
	}
	require.Equal(t, []string{"1:1", "2:2"}, got, "numbered in the order of the turns")
}

// Issue 41: a claim on an ordered table takes a key's message only with
// every unpublished message of its key before it; a second claimer gets
// none of a key in flight, other keys flow.
func TestConformOrderedClaimsKeepKeyOrder(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, orderedCfg(nil), func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		k1 := addTx(t, db, s, outbox.Event{Type: "e", Key: "k1"}, outbox.Event{Type: "e", Key: "k1"}, outbox.Event{Type: "e", Key: "k1"})
		k2 := addTx(t, db, s, outbox.Event{Type: "e", Key: "k2"}, outbox.Event{Type: "e"})

		first, err := s.Claim(ctx, 2, time.Minute)
		require.NoError(t, err)
		require.Equal(t, k1[:2], ids(first))
		second, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, k2, ids(second), "k1's third waits for the two in flight; k2 and the unkeyed flow")
		require.NoError(t, s.MarkPublished(ctx, first...))
		require.NoError(t, s.MarkPublished(ctx, second...))
		require.Equal(t, k1[2:], claimAndPublish(t, s, 1))
		require.Equal(t, outbox.OrderedByKey, s.Ordering())
	})
}

// Issue 41: a message that fails holds the later messages of its key,
// out of the claims' way; others flow. Retrying it or discarding it
// brings them back, in order.
func TestConformOrderedFailureHoldsItsKey(t *testing.T) {
	t.Parallel()
	for _, fix := range []string{"retry", "discard"} {
		t.Run(fix, func(t *testing.T) {
			t.Parallel()
			onEveryBackend(t, orderedCfg(&outbox.StoreConfig{MaxAttempts: 1}), func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
				ctx := context.Background()
				k := addTx(t, db, s, outbox.Event{Type: "e", Key: "k"}, outbox.Event{Type: "e", Key: "k"}, outbox.Event{Type: "e", Key: "k"})
				msgs, err := s.Claim(ctx, 1, time.Minute)
				require.NoError(t, err)
				require.Equal(t, k[:1], ids(msgs))
				require.NoError(t, s.MarkFailed(ctx, msgs[0], "unroutable"))
				other := addTx(t, db, s, outbox.Event{Type: "e", Key: "j"})

				st, err := s.Stats(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 1, st.Parked)
				require.EqualValues(t, 4, st.Pending)
				require.EqualValues(t, 1, st.BlockedKeys)
				require.Equal(t, other, claimAndPublish(t, s, 1), "other keys flow, none of the key behind its failed message")
				_, _, err = s.Reconcile(ctx)
				require.NoError(t, err)
				st, err = s.Stats(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 2, st.Held, "the later messages of its key are held")

				want := k
				if fix == "retry" {
					n, err := s.Retry(ctx, k[0])
					require.NoError(t, err)
					require.EqualValues(t, 1, n)
				} else {
					n, err := s.Discard(ctx, k[0])
					require.NoError(t, err)
					require.EqualValues(t, 1, n)
					want = k[1:]
				}
				require.Equal(t, want, claimAndPublish(t, s, len(want)), "back, in order")
			})
		})
	}
}

// Issue 41: Reconcile mends what a hold or a bring-back missed: a held
// message whose key has no failed message comes back; a waiting one
// behind a failed message of its key is held.
func TestMySQLOrderedReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := orderedMySQL(t, nil)
	k := addTx(t, db, s, outbox.Event{Type: "e", Key: "k"}, outbox.Event{Type: "e", Key: "k"})
	j := addTx(t, db, s, outbox.Event{Type: "e", Key: "j"}, outbox.Event{Type: "e", Key: "j"})
	// By hand: k's second held for nothing; j's first failed, its second not held.
	_, err := db.Exec(`UPDATE outbox SET held = TRUE WHERE id = ?`, k[1])
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE outbox SET attempts = 1, available_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?`, j[0])
	require.NoError(t, err)
	held, unheld, err := s.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, held)
	require.EqualValues(t, 1, unheld)
	msgs, err := s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Equal(t, k, ids(msgs))
}

// Issue 41: ConvertOrdering makes a MySQL table ordered and unordered
// online; every store reads the table's mode, whatever it was
// configured for.
func TestMySQLConvertOrdering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := mysqlStore(t, nil)
	c, err := s.ConvertOrdering(ctx, outbox.OrderedByKey, true, time.Second)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, c.From)
	require.Contains(t, c.DDL, "CREATE TRIGGER `outbox_order` BEFORE INSERT ON `outbox`")
	o, err := s.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, o, "a dry run changes nothing")

	addTx(t, db, s, outbox.Event{Type: "before", Key: "k"})
	_, err = s.ConvertOrdering(ctx, outbox.OrderedByKey, false, time.Second)
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, s.Ordering())
	again, err := s.ConvertOrdering(ctx, outbox.OrderedByKey, false, time.Second)
	require.NoError(t, err)
	require.Empty(t, again.DDL, "already ordered")
	after := addTx(t, db, s, outbox.Event{Type: "after", Key: "k"})
	msgs, err := s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "written before the conversion (ord 0) first, then after")
	require.Equal(t, after[0], msgs[1].ID)

	_, err = s.ConvertOrdering(ctx, outbox.Unordered, false, time.Second)
	require.NoError(t, err)
	o, err = s.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, o)
}

// claimAndPublish claims (and runs Maintain, which gives out what a log table
// set aside) until it has n messages or 10s passed, publishes them, and
// returns their ids in the order claimed.
func claimAndPublish(t *testing.T, s *outbox.Store, n int) []string {
	t.Helper()
	ctx := context.Background()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		require.NoError(t, s.Maintain(ctx))
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.NoError(t, s.MarkPublished(ctx, msgs...))
		got = append(got, ids(msgs)...)
		if len(msgs) == 0 {
			time.Sleep(20 * time.Millisecond) // a look is due every 250ms at most
		}
	}
	return got
}
