package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// mysqlStore returns a store on a table of its own in a database of the
// test's own on the real MariaDB (or MySQL) of TEST_MYSQL_DSN.
func mysqlStore(t *testing.T, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store) {
	t.Helper()
	db := mysqltest.DB(t)
	s, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	require.Equal(t, outbox.MySQL, s.Database(), "told from the pool's driver")
	require.NoError(t, s.CreateSchemaIfAbsent(context.Background()))
	require.NoError(t, s.CreateSchemaIfAbsent(context.Background()), "idempotent")
	return db, s
}

// addTx writes evts in a transaction of their own and commits it.
func addTx(t *testing.T, db *sql.DB, s *outbox.Store, evts ...outbox.Event) []string {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	ids, err := s.AddIDs(context.Background(), tx, evts...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return ids
}

// Issue 41: a *sql.DB of go-sql-driver/mysql gives a store on MySQL or
// MariaDB; the events written through a transaction are claimed in the
// order they were written, with everything Add was given, and published.
func TestConformWriteClaimPublish(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		layout, err := s.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, b.layout(), layout)
		require.Equal(t, outbox.Unordered, s.Ordering())
		require.NoError(t, s.CheckOrdering(ctx))

		const id = "0190b4a2-7c3e-7000-8000-000000000001"
		ids := addTx(t, db, s,
			outbox.Event{ID: id, Type: "order.placed", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"tenant": "ünïcode"}},
			outbox.Event{Type: "order.paid", Exchange: "billing", RoutingKey: "paid", ContentType: "text/plain", Payload: []byte("two")},
			outbox.Event{Type: "order.shipped"})
		require.Len(t, ids, 3)
		require.Equal(t, id, ids[0])

		n, err := s.Pending(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, n)

		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 3)
		for i, m := range msgs {
			require.Equal(t, ids[i], m.ID, "in the order written")
			require.False(t, m.ClaimedUntil.IsZero())
			require.WithinDuration(t, time.Now(), m.CreatedAt, time.Minute, "UTC, by the database's clock")
		}
		require.Less(t, msgs[0].Seq, msgs[1].Seq)
		require.Equal(t, "order.placed", msgs[0].EventType)
		require.Equal(t, "order-1", msgs[0].Key)
		require.Equal(t, map[string]string{"tenant": "ünïcode"}, msgs[0].Headers)
		require.Equal(t, []byte(`{"n":1}`), msgs[0].Payload)
		require.Equal(t, "application/json", msgs[0].ContentType)
		require.Equal(t, "billing", msgs[1].Exchange)
		require.Equal(t, "paid", msgs[1].RoutingKey)
		require.Equal(t, "text/plain", msgs[1].ContentType)
		require.Equal(t, "order.shipped", msgs[2].RoutingKey, "the default router: the event type")
		require.Equal(t, []byte{}, msgs[2].Payload)

		again, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, again, "a message is in at most one live claim")
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, st.InFlight)
		require.EqualValues(t, 3, st.Pending)

		require.NoError(t, s.MarkPublished(ctx, msgs...))
		if b.mysql { // a published message keeps its claim's token there
			require.NoError(t, s.MarkPublished(ctx, msgs...), "a mark repeated by the claim that made it is not a lost lease")
		}
		n, err = s.Pending(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		st, err = s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, st.PublishedLastHour)
		require.Zero(t, st.Pending)
	})
}

// Issue 41: the same refusals as on PostgreSQL. Add writes through a
// transaction only, all or nothing; a rolled-back transaction leaves
// nothing; an id already written is ErrDuplicateID.
func TestConformWritesAreTransactional(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()

		err := s.Add(ctx, db, outbox.Event{Type: "x"})
		require.ErrorIs(t, err, outbox.ErrNoTransaction)

		tx, err := db.Begin()
		require.NoError(t, err)
		require.NoError(t, s.Add(ctx, tx, outbox.Event{Type: "rolled.back"}))
		require.NoError(t, tx.Rollback())

		// 250 events go in three INSERTs inside a savepoint; one bad event
		// anywhere writes none of them.
		evts := make([]outbox.Event, 250)
		for i := range evts {
			evts[i] = outbox.Event{Type: "many", Payload: fmt.Appendf(nil, "%d", i)}
		}
		evts[249].Type = ""
		tx, err = db.Begin()
		require.NoError(t, err)
		require.ErrorIs(t, s.Add(ctx, tx, evts...), outbox.ErrInvalidEvent)
		evts[249].Type = "many"
		require.NoError(t, s.Add(ctx, tx, evts...))
		require.NoError(t, tx.Commit())
		n, err := s.Pending(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 250, n, "the rolled-back event is not there")

		const id = "0190b4a2-7c3e-7000-8000-0000000000aa"
		addTx(t, db, s, outbox.Event{ID: id, Type: "once"})
		tx, err = db.Begin()
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // ended if the test fails
		err = s.Add(ctx, tx, outbox.Event{ID: id, Type: "twice"})
		require.ErrorIs(t, err, outbox.ErrDuplicateID)
		require.ErrorContains(t, err, id+" is already in "+s.Table())
	})
}

// Issue 41: marks are fenced by the claim. A claim whose lease ran out and
// was taken by another finds its marks refused (a LeaseLostError naming
// the messages), and the later claim's marks go through.
func TestConformLostLeaseIsFenced(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		ids := addTx(t, db, s, outbox.Event{Type: "a"}, outbox.Event{Type: "b"})

		first, err := s.Claim(ctx, 10, 50*time.Millisecond)
		require.NoError(t, err)
		require.Len(t, first, 2)
		var second []outbox.Message
		require.Eventually(t, func() bool {
			second, err = s.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			return len(second) > 0
		}, 10*time.Second, 20*time.Millisecond, "claimable again once the lease ran out")
		require.Len(t, second, 2)

		err = s.MarkPublished(ctx, first...)
		var lost *outbox.LeaseLostError
		require.ErrorAs(t, err, &lost)
		require.ElementsMatch(t, ids, lost.IDs)
		require.ErrorIs(t, s.Release(ctx, first...), outbox.ErrLeaseLost)
		require.ErrorIs(t, s.MarkFailed(ctx, first[0], "late"), outbox.ErrLeaseLost)

		// The later claim publishes one and releases the other, which is then
		// claimable at once.
		require.NoError(t, s.MarkPublished(ctx, second[0]))
		require.NoError(t, s.Release(ctx, second[1]))
		third, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, third, 1)
		require.Equal(t, ids[1], third[0].ID)
		require.Zero(t, third[0].Attempts, "a release counts no attempt")
	})
}

// Issue 41: a failed attempt waits its backoff; the last one parks the
// message, which operators list, retry and discard.
func TestConformFailuresPark(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, func() *outbox.StoreConfig {
		return &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }}
	}, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		ids := addTx(t, db, s, outbox.Event{Type: "fails", Key: "k1"}, outbox.Event{Type: "fails too"})

		for attempt := 1; attempt <= 2; attempt++ {
			msgs, err := s.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, msgs, 2, "attempt %d", attempt)
			require.Equal(t, attempt-1, msgs[0].Attempts)
			for _, m := range msgs {
				require.NoError(t, s.MarkFailed(ctx, m, fmt.Sprintf("broker said no \x00 (%d)", attempt)))
			}
		}
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, msgs, "parked messages are not claimed")

		parked, err := s.Parked(ctx, 10)
		require.NoError(t, err)
		require.Len(t, parked, 2)
		require.Equal(t, 2, parked[0].Attempts)
		require.Equal(t, "broker said no  (2)", parked[0].LastError, "a NUL cannot be stored")
		require.False(t, parked[0].ParkedAt.IsZero())
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Parked)
		require.EqualValues(t, 2, st.Pending)
		require.EqualValues(t, 1, st.BlockedKeys, "keys of parked messages")
		g, err := s.Gauges(ctx, 0)
		require.NoError(t, err)
		require.EqualValues(t, 2, g.Parked)
		require.EqualValues(t, 2, g.Pending)

		n, err := s.Discard(ctx, ids[1], "0190b4a2-7c3e-7000-8000-00000000ffff")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "only parked messages are discarded")
		n, err = s.Retry(ctx, ids[0])
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		msgs, err = s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, ids[0], msgs[0].ID)
		require.Zero(t, msgs[0].Attempts, "a retry starts again")
		require.NoError(t, s.MarkFailed(ctx, msgs[0], "again"))
		msgs, err = s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.NoError(t, s.MarkFailed(ctx, msgs[0], "and again"))
		n, err = s.RetryAllParked(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		pending, err := s.Pending(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, pending, "the discarded one is not pending")
	})
}

// Issue 41: relays claiming side by side never take one message twice
// (FOR UPDATE SKIP LOCKED, then the lease), and between them take all.
func TestConformConcurrentClaimsAreDisjoint(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		const total = 3000
		for i := 0; i < total; i += 500 {
			evts := make([]outbox.Event, 500)
			for j := range evts {
				evts[j] = outbox.Event{Type: "bulk", Payload: fmt.Appendf(nil, "%d", i+j)}
			}
			addTx(t, db, s, evts...)
		}
		var (
			mu   sync.Mutex
			seen = map[string]int{}
			wg   sync.WaitGroup
			errs = make(chan error, 4)
		)
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					msgs, err := s.Claim(ctx, 50, time.Minute)
					if err != nil {
						errs <- err
						return
					}
					if len(msgs) == 0 {
						return
					}
					mu.Lock()
					for _, m := range msgs {
						seen[m.ID]++
					}
					mu.Unlock()
					if err := s.MarkPublished(ctx, msgs...); err != nil {
						errs <- err
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
		require.Len(t, seen, total)
		for id, n := range seen {
			require.Equal(t, 1, n, "message %s claimed %d times", id, n)
		}
		n, err := s.Pending(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

// Issue 41: a claim stops at StoreConfig.BatchMaxBytes (at least one
// message, however large), and a row that cannot be relayed as written
// (headers that Add would refuse, written by SQL) is parked by the claim,
// not returned and not left to block the others.
func TestMySQLClaimBoundsAndUnfitRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := mysqlStore(t, &outbox.StoreConfig{BatchMaxBytes: 1000})
	big := make([]byte, 600)
	addTx(t, db, s, outbox.Event{Type: "big", Payload: big}, outbox.Event{Type: "big", Payload: big}, outbox.Event{Type: "big", Payload: big})
	msgs, err := s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "the second starts below the bound")
	require.NoError(t, s.MarkPublished(ctx, msgs...))

	_, err = db.Exec("INSERT INTO outbox (id, event_type, payload, headers) VALUES ('0190b4a2-7c3e-7000-8000-0000000000bb', 'by.sql', '', '{\"n\": 1}')")
	require.NoError(t, err)
	msgs, err = s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "the good one")
	require.Equal(t, "big", msgs[0].EventType)
	parked, err := s.Parked(ctx, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "0190b4a2-7c3e-7000-8000-0000000000bb", parked[0].ID)
	require.Contains(t, parked[0].LastError, "parked when claimed")
}

// Issue 41: purges delete only published messages older than asked, in
// statements of PurgeBatchSize rows, and Purgeable counts them first.
func TestMySQLPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := mysqlStore(t, &outbox.StoreConfig{PurgeBatchSize: 7})
	evts := make([]outbox.Event, 30)
	for i := range evts {
		evts[i] = outbox.Event{Type: "p"}
	}
	addTx(t, db, s, evts...)
	msgs, err := s.Claim(ctx, 20, time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.MarkPublished(ctx, msgs...))

	n, err := s.Purgeable(ctx, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "none is an hour old")
	n, err = s.Purgeable(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	var steps []int64
	n, err = s.PurgePublishedProgress(ctx, 0, func(d int64) { steps = append(steps, d) })
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	require.Equal(t, []int64{7, 14, 20}, steps, "in batches of 7")
	pending, err := s.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, pending, "unpublished messages are never purged")
}

// Issue 41: what only PostgreSQL has is refused on MySQL with
// ErrUnsupportedDatabase, saying so; a store configured for one database
// on a pool of the other is an error.
func TestMySQLRefusesWhatIsPostgreSQLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := mysqlStore(t, nil)
	_, err := s.ConvertToLog(ctx, true, time.Second)
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.ErrorIs(t, s.CreateLogSchemaIfAbsent(ctx), outbox.ErrUnsupportedDatabase)
	ok, err := s.HasNotifyTrigger(ctx)
	require.NoError(t, err)
	require.False(t, ok)

	_, err = outbox.NewStore(db, &outbox.StoreConfig{Database: outbox.PostgreSQL})
	require.EqualError(t, err, "outbox: NewStore: the store's database is PostgreSQL, and the *sql.DB's driver speaks MySQL")
	_, err = outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Database: outbox.MySQL})
	require.Error(t, err)
	w, err := outbox.NewStore(nil, &outbox.StoreConfig{Database: outbox.MySQL})
	require.NoError(t, err)
	require.Equal(t, outbox.MySQL, w.Database())

	missing, err := outbox.NewStore(db, &outbox.StoreConfig{Table: "nowhere"})
	require.NoError(t, err)
	_, err = missing.Layout(ctx)
	require.ErrorContains(t, err, "nowhere")
	_, err = missing.Claim(ctx, 1, time.Second)
	require.Error(t, err)
	require.False(t, errors.Is(err, outbox.ErrLeaseLost))
}

// Issue 41: the MySQL migration files apply as golang-migrate runs them
// (one file, multiStatements=true) and give a table the store relays
// from; the down file drops it.
func TestMySQLMigrationsApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("mysql", mysqltest.DSN(t)+"&multiStatements=true")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	run := func(path string) {
		t.Helper()
		text, err := outbox.Migrations.ReadFile(path)
		require.NoError(t, err)
		_, err = db.Exec(string(text))
		require.NoError(t, err, path)
	}
	run("migrations/mysql/000001_create_outbox.up.sql")
	s, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	l, err := s.Layout(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.LayoutRows, l)
	tx, err := db.Begin()
	require.NoError(t, err)
	err = s.Add(ctx, tx, outbox.Event{Type: "delayed", NotBefore: time.Now().Add(time.Hour)})
	require.ErrorContains(t, err, "bring the table up to date", "a delayed event needs 000002")
	require.NoError(t, tx.Rollback())
	require.NoError(t, s.Maintain(ctx), "no scheduled table: nothing to move, no error")
	run("migrations/mysql/000002_scheduled.up.sql")
	addTx(t, db, s, outbox.Event{Type: "migrated"}, outbox.Event{Type: "delayed", NotBefore: time.Now().Add(time.Hour)})
	msgs, err := s.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Scheduled)
	// The store found no scheduled table a moment ago; a delayed event
	// written since tells it there is one: it is moved once due, not a
	// minute later.
	soon := addTx(t, db, s, outbox.Event{Type: "soon", NotBefore: time.Now().Add(200 * time.Millisecond)})
	got, _ := claimDue(t, s, 20*time.Second)
	require.Equal(t, soon, ids(got))
	run("migrations/mysql/000002_scheduled.down.sql")
	run("migrations/mysql/000001_create_outbox.down.sql")
	_, err = s.Layout(ctx)
	require.ErrorContains(t, err, "does not exist")
	var left int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()`).Scan(&left))
	require.Zero(t, left, "the down migrations drop everything")
}
