package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Ordered tables of the log layout (issue 21 on the storage of issue 20).

// payloads returns the payloads of msgs.
func payloads(msgs []outbox.Message) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, string(m.Payload))
	}
	return out
}

// publishUntil claims and publishes until want messages were claimed in
// all, waiting for those not due yet, and returns their payloads in the
// order claimed.
func publishUntil(t *testing.T, s *outbox.Store, want int) []string {
	t.Helper()
	ctx := context.Background()
	var got []string
	for deadline := time.Now().Add(10 * time.Second); len(got) < want; {
		require.False(t, time.Now().After(deadline), "claimed %d of %d in 10s: %v", len(got), want, got)
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.NoError(t, s.MarkPublished(ctx, msgs...))
		got = append(got, payloads(msgs)...)
		if len(msgs) == 0 {
			time.Sleep(10 * time.Millisecond) // polling, as a relay does
		}
	}
	return got
}

// A writer of a key whose transaction got its id before another writer of
// the key, and writes after that one committed: the order of tx, seq puts
// it first, its commit (and ord) second. An ordered log table relays it
// second, even when a batch of one splits the window between them; and
// while a batch holds a key, no other batch takes a message of that key:
// the next one stops before it.
func TestLogOrderedClaimFollowsCommitOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLog(t, ordered())
	mode, err := b.store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, mode)
	require.NoError(t, b.store.CheckOrdering(ctx))

	early, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer early.Rollback() //nolint:errcheck
	var xid string
	require.NoError(t, early.QueryRowContext(ctx, "SELECT pg_current_xact_id()::text").Scan(&xid))
	b.addCommitted(t, keyed("a", 1), keyed("b", 1))
	require.NoError(t, b.store.Add(ctx, early, keyed("a", 2)))
	require.NoError(t, early.Commit())
	b.addCommitted(t, keyed("a", 3))
	require.EqualValues(t, 1, dbtest.Count(t, b.db, `SELECT count(*) FROM "`+b.table+`" WHERE tx::text = $1`, xid),
		"a2 has the smaller transaction id")

	a1, got := claimed(t, b.store, 1)
	require.Equal(t, []string{p("a", 1)}, got, "a batch of one splits the window")
	b1, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("b", 1)}, got, "the next batch stops before a2: a1's batch is unfinished")
	_, got = claimed(t, b.store, 10)
	require.Empty(t, got)
	require.NoError(t, b.store.MarkPublished(ctx, a1...))
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 2), p("a", 3)}, got, "in commit order, not in the order of tx")
	require.NoError(t, b.store.MarkPublished(ctx, b1...))
}

// A failed message holds back the later messages of its key (they wait in
// the failed table, behind it) and nothing else; once it is published they
// follow, in order. A parked one blocks its key until it is discarded.
func TestLogOrderedFailureHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := ordered()
	cfg.MaxAttempts = 2
	b := setupLog(t, cfg)
	b.addCommitted(t, keyed("a", 1), keyed("b", 1))
	first, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1), p("b", 1)}, got)
	require.NoError(t, b.store.MarkFailed(ctx, first[0], "no route"))
	require.NoError(t, b.store.MarkPublished(ctx, first[1]))

	b.addCommitted(t, keyed("a", 2), keyed("b", 2))
	b.addCommitted(t, keyed("a", 3))
	b2, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("b", 2)}, got, "a2 and a3 are set aside behind a1")
	st, err := b.store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Held)
	require.EqualValues(t, 4, st.Pending, "a1 backing off, a2 and a3 held, b2 claimed")
	g, err := b.store.Gauges(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, st.Held, g.Held)
	require.NoError(t, b.store.MarkPublished(ctx, b2...))

	// Due again, a1 comes first with a2 and a3 behind it, in order.
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`_failed" SET available_at = now()`)
	require.NoError(t, err)
	as, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1), p("a", 2), p("a", 3)}, got)
	require.Equal(t, 1, as[0].Attempts)

	// a1 fails again and is parked; a2 and a3, not sent, are released.
	require.NoError(t, b.store.MarkFailed(ctx, as[0], "no route"))
	require.NoError(t, b.store.Release(ctx, as[1:]...))
	b.addCommitted(t, keyed("a", 4), keyed("c", 1))
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`_failed" SET available_at = now() WHERE parked_at IS NULL`)
	require.NoError(t, err)
	c1, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("c", 1)}, got, "key a is blocked by its parked message")
	require.NoError(t, b.store.MarkPublished(ctx, c1...))
	st, err = b.store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.BlockedKeys)
	require.EqualValues(t, 3, st.Held)

	n, err := b.store.Discard(ctx, as[0].ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 2), p("a", 3), p("a", 4)}, got)
}

// Made ordered while a window is half claimed, and unordered again: what
// was written before is relayed in the order of tx and seq, what was
// written after in commit order per key; nothing is lost or taken twice.
func TestLogConvertOrdering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLog(t, nil)
	b.addCommitted(t, keyed("a", 1), keyed("a", 2), keyed("a", 3))
	a1, got := claimed(t, b.store, 1)
	require.Equal(t, []string{p("a", 1)}, got)

	dry, err := b.store.ConvertOrdering(ctx, outbox.OrderedByKey, true, time.Second)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, dry.From)
	require.EqualValues(t, 3, dry.Pending)
	require.Contains(t, dry.DDL, "CREATE TRIGGER")
	mode, err := b.store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Unordered, mode, "a dry run changes nothing")

	// While a batch is unfinished, an ordered table hands out nothing.
	c, err := b.store.ConvertOrdering(ctx, outbox.OrderedByKey, false, time.Second)
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, c.To)
	require.NoError(t, b.store.CheckOrdering(ctx))
	_, got = claimed(t, b.store, 10)
	require.Empty(t, got)
	require.NoError(t, b.store.MarkPublished(ctx, a1...))

	early, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer early.Rollback() //nolint:errcheck
	_, err = early.ExecContext(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	b.addCommitted(t, keyed("b", 1))
	require.NoError(t, b.store.Add(ctx, early, keyed("b", 2)))
	require.NoError(t, early.Commit())
	b.addCommitted(t, keyed("b", 3))

	var all []string
	for {
		msgs, err := b.store.Claim(ctx, 2, time.Minute)
		require.NoError(t, err)
		if len(msgs) == 0 {
			break
		}
		require.NoError(t, b.store.MarkPublished(ctx, msgs...))
		all = append(all, payloads(msgs)...)
	}
	require.Equal(t, []string{p("a", 2), p("a", 3), p("b", 1), p("b", 2), p("b", 3)}, all,
		"the rest of the half-claimed window first, then the rows written since, by commit")

	// Back to unordered: a message held behind a failed one comes back.
	b.addCommitted(t, keyed("c", 1), keyed("c", 2))
	msgs, got := claimed(t, b.store, 1)
	require.Equal(t, []string{p("c", 1)}, got)
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "no route"))
	_, got = claimed(t, b.store, 10)
	require.Empty(t, got, "c2 is held behind c1")
	c, err = b.store.ConvertOrdering(ctx, outbox.Unordered, false, time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Held)
	_, got = claimed(t, b.store, 10)
	require.Equal(t, []string{p("c", 2)}, got, "held, it is due at once in an unordered table")
}

// The failed table's copies (failed messages, and those held behind them)
// go away with their events' partitions once published: on an ordered
// table it carries the backlogs of hot keys too.
func TestLogOrderedFailedCopiesPurged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLogSized(t, ordered(), 10, 4, 4)
	ddl, err := outbox.LogOrderSchema(b.table)
	require.NoError(t, err)
	_, err = b.db.ExecContext(ctx, ddl)
	require.NoError(t, err)
	failed := `SELECT count(*) FROM "` + b.table + `_failed"`

	b.addCommitted(t, keyed("a", 1), keyed("a", 2), keyed("a", 3), keyed("b", 1))
	msgs, got := claimed(t, b.store, 10)
	require.Equal(t, []string{p("a", 1), p("a", 2), p("a", 3), p("b", 1)}, got)
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "no route"))
	require.NoError(t, b.store.Release(ctx, msgs[1:3]...))
	require.NoError(t, b.store.MarkPublished(ctx, msgs[3]))
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`_failed" SET available_at = now()`)
	require.NoError(t, err)
	order := publishUntil(t, b.store, 3) // the released ones, set aside, wait for a1
	require.Equal(t, []string{p("a", 1), p("a", 2), p("a", 3)}, order)
	require.EqualValues(t, 3, dbtest.Count(t, b.db, failed), "a1, and a2 and a3 set aside behind it")

	for i := 0; i < 20; i++ { // writers move on to partition 2: 0 is neither theirs nor next
		b.addCommitted(t, outbox.Event{Type: "e", Payload: []byte("x")})
	}
	require.Equal(t, 20, relayAll(t, b.store))
	n, err := b.store.PurgePublished(ctx, 0)
	require.NoError(t, err)
	require.Positive(t, n)
	require.Zero(t, dbtest.Count(t, b.db, failed), "their events are gone, and so are the copies")
}

// A store that saw batches up to some id before the table and its
// bookkeeping were emptied (outbox bench does it between runs) keeps the
// order: the batch ids begin again below what it knew, and it looks at
// them all. (It found 7,302 first deliveries out of order in three runs of
// `outbox bench --layout log --ordered --keys 1` before.)
func TestLogOrderedAfterTruncate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupLog(t, ordered())
	outbox.SetLogLow(b.store, 1000)
	b.addCommitted(t, keyed("a", 1))
	b.addCommitted(t, keyed("a", 2))
	b.addCommitted(t, keyed("a", 3))
	first, got := claimed(t, b.store, 1)
	require.Equal(t, []string{p("a", 1)}, got)
	_, got = claimed(t, b.store, 10)
	require.Empty(t, got, "a's later messages wait while a1's batch is unfinished (set aside, or not taken)")
	require.NoError(t, b.store.MarkPublished(ctx, first...))
	var rest []string
	for range 10 {
		msgs, got := claimed(t, b.store, 10)
		require.NoError(t, b.store.MarkPublished(ctx, msgs...))
		rest = append(rest, got...)
	}
	require.Equal(t, []string{p("a", 2), p("a", 3)}, rest)
}

// An ordered table of the rows layout becomes an ordered table of the log
// layout: a key's failed message and those held behind it keep their
// order in the failed table, the other waiting messages theirs in the new
// table, and messages written after the conversion follow them.
func TestConvertOrderedTableToLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := ordered()
	cfg.Backoff = func(int) time.Duration { return time.Hour } // until the test makes it due
	b := setup(t, cfg)
	b.addCommitted(t, keyed("a", 1), keyed("a", 2), keyed("b", 1))
	b.addCommitted(t, keyed("a", 3), keyed("b", 2))
	msgs, got := claimed(t, b.store, 1)
	require.Equal(t, []string{p("a", 1)}, got)
	require.NoError(t, b.store.MarkFailed(ctx, msgs[0], "no route"))
	_, _, err := b.store.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.count(t, "held"), "a2 and a3 are held behind a1")
	b.addCommitted(t, keyed("a", 4)) // not held yet: Reconcile has not run since

	c, err := b.store.ConvertToLog(ctx, false, time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 3, c.Pending, "b1, b2 and a4")
	require.EqualValues(t, 3, c.Failed, "a1, and a2 and a3 held behind it")
	mode, err := b.store.TableOrdering(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.OrderedByKey, mode)
	require.NoError(t, b.store.CheckOrdering(ctx))
	b.addCommitted(t, keyed("a", 5), keyed("b", 3))

	// While a1 backs off, a4 and a5 are claimed and set aside behind it,
	// and b's messages go. (The copied rows were written by the
	// conversion's transaction, which its own boundary snapshot sees: they
	// come in a window of their own, before a5 and b3.)
	order := publishUntil(t, b.store, 3)
	require.Equal(t, []string{p("b", 1), p("b", 2), p("b", 3)}, order)
	// Then a1 is due.
	_, err = b.db.ExecContext(ctx, `UPDATE "`+b.table+`_failed" SET available_at = now()`)
	require.NoError(t, err)
	order = append(order, publishUntil(t, b.store, 5)...)
	byKey := map[string][]string{}
	for _, o := range order {
		byKey[o[8:9]] = append(byKey[o[8:9]], o)
	}
	require.Equal(t, []string{p("a", 1), p("a", 2), p("a", 3), p("a", 4), p("a", 5)}, byKey["a"])
	require.Equal(t, []string{p("b", 1), p("b", 2), p("b", 3)}, byKey["b"])
}
