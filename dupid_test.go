package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// spellings are five ways of writing one UUID that uuid.Parse and
// PostgreSQL both read as that UUID.
func spellings(id string) []string {
	return []string{
		id,
		strings.ToUpper(id),
		"{" + id + "}",
		"urn:uuid:" + id,
		strings.ReplaceAll(id, "-", ""),
	}
}

// Issue 47, item 2: the same Event.ID in several transactions, in any of
// its spellings, is refused with ErrDuplicateID on every layout (the log
// layout committed and published each), and nothing is published twice.
// The log table's partitions hold 2 events each, so that the copies fall
// in other partitions than the first.
func TestDuplicateIDRefusedOnEveryLayout(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(t *testing.T) *testBundle{
		"rows": func(t *testing.T) *testBundle { return setup(t, nil) },
		"log":  func(t *testing.T) *testBundle { return setupLogSized(t, nil, 2, 8, 4) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			id := uuid.NewString()
			got, err := func() ([]string, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer tx.Rollback() //nolint:errcheck
				ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "order.placed", ID: "urn:uuid:" + strings.ToUpper(id)})
				if err == nil {
					err = tx.Commit()
				}
				return ids, err
			}()
			require.NoError(t, err)
			require.Equal(t, []string{id}, got, "stored in canonical form")
			for i, spelled := range spellings(id) {
				// Other events between the copies move the writes on to
				// other partitions.
				b.addCommitted(t, events(3)...)
				tx, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				err = b.store.Add(ctx, tx, outbox.Event{Type: "order.placed", ID: spelled})
				require.ErrorIs(t, err, outbox.ErrDuplicateID, "spelling %d: %s", i, spelled)
				require.ErrorContains(t, err, id)
				require.NoError(t, tx.Rollback())
				t.Logf("spelling %d (%s): %v", i, spelled, err)
			}
			// A writer of plain SQL is refused as well.
			_, err = b.db.ExecContext(ctx, `INSERT INTO "`+b.table+`" (id, event_type, payload) VALUES ($1, 'order.placed', '')`, "{"+strings.ToUpper(id)+"}")
			require.Error(t, err)
			require.Contains(t, err.Error(), "23505")

			require.EqualValues(t, 1, b.count(t, "id = '"+id+"'"))
			published := map[string]int{}
			for {
				msgs, err := b.store.Claim(ctx, 7, time.Minute)
				require.NoError(t, err)
				if len(msgs) == 0 {
					break
				}
				for _, m := range msgs {
					published[m.ID]++
				}
				require.NoError(t, b.store.MarkPublished(ctx, msgs...))
			}
			require.Len(t, published, 1+5*3)
			for pid, n := range published {
				require.Equal(t, 1, n, "published once: %s", pid)
			}
		})
	}
}

// Two transactions writing one id at once: the second waits for the first
// and is refused when it commits, on either layout.
func TestDuplicateIDOfConcurrentWriters(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(t *testing.T) *testBundle{
		"rows": func(t *testing.T) *testBundle { return setup(t, nil) },
		"log":  func(t *testing.T) *testBundle { return setupLog(t, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			id := uuid.NewString()
			first, err := b.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer first.Rollback() //nolint:errcheck
			require.NoError(t, b.store.Add(ctx, first, outbox.Event{Type: "a", ID: id}))
			done := make(chan error, 1)
			go func() {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					done <- err
					return
				}
				defer tx.Rollback() //nolint:errcheck
				if err = b.store.Add(ctx, tx, outbox.Event{Type: "a", ID: strings.ToUpper(id)}); err == nil {
					err = tx.Commit()
				}
				done <- err
			}()
			waitForLockWait(t, b.db)
			require.NoError(t, first.Commit())
			err = <-done
			require.ErrorIs(t, err, outbox.ErrDuplicateID)
			require.EqualValues(t, 1, b.count(t, "id = '"+id+"'"))
		})
	}
}

// waitForLockWait waits until some session of the database waits for a
// transaction's lock (the second writer of an id).
func waitForLockWait(t *testing.T, db *sql.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid' AND query LIKE 'INSERT INTO%'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

// A log table created before ids were unique gets their uniqueness from
// `outbox schema --apply` (Store.CreateLogSchemaIfAbsent); one that holds
// an id twice in one partition is refused with advice.
func TestLogSchemaApplyMakesIDsUnique(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLogSized(t, nil, 2, 8, 4)
	var old strings.Builder // the indexes and trigger of the version before
	old.WriteString(`DROP TRIGGER "` + b.table + `_id_check" ON "` + b.table + `";
DROP FUNCTION "` + b.table + `_id_check"();
CREATE INDEX "` + b.table + `_id_idx" ON "` + b.table + `" (id);
`)
	for i := range 8 {
		old.WriteString(`DROP INDEX "` + b.table + `_p0` + string(rune('0'+i)) + `_id_key";` + "\n")
	}
	_, err := b.db.ExecContext(ctx, old.String())
	require.NoError(t, err)
	id := uuid.NewString()
	b.addCommitted(t, outbox.Event{Type: "a", ID: id})
	b.addCommitted(t, events(3)...)
	b.addCommitted(t, outbox.Event{Type: "a", ID: id})
	require.EqualValues(t, 2, b.count(t, "id = '"+id+"'"), "the version before took the copy")

	require.NoError(t, b.store.CreateLogSchemaIfAbsent(ctx), "copies in two partitions do not stop the upgrade")
	b.addCommitted(t, events(3)...)
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	err = b.store.Add(ctx, tx, outbox.Event{Type: "a", ID: id})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)
	require.NoError(t, tx.Rollback())

	// Two copies in one partition: the unique index cannot be built.
	_, err = b.db.ExecContext(ctx, old.String())
	require.NoError(t, err)
	twice := uuid.NewString()
	b.addCommitted(t, events(1)...)
	tx, err = b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `SELECT setval('"`+b.table+`_seq"', 1000, false)`) // both in one chunk
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO "`+b.table+`" (id, event_type, payload) VALUES ($1, 'a', ''), ($1, 'a', '')`, twice)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	err = b.store.CreateLogSchemaIfAbsent(ctx)
	require.Error(t, err)
	require.ErrorContains(t, err, "holds an event id twice")
	require.ErrorContains(t, err, "GROUP BY id HAVING count(*) > 1")
	t.Log(err)
}
