package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// claimDue calls Maintain (which moves the delayed messages that are due
// into the table) and claims, until a claim returns something or timeout
// passes; it returns what was claimed and when.
func claimDue(t *testing.T, s *outbox.Store, timeout time.Duration) ([]outbox.Message, time.Time) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		require.NoError(t, s.Maintain(ctx))
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		if len(msgs) > 0 {
			return msgs, time.Now()
		}
		time.Sleep(5 * time.Millisecond) // a relay's poll, shortened
	}
	t.Fatalf("nothing claimed within %s", timeout)
	return nil, time.Time{}
}

// Issue 42: a delayed event commits with its transaction, waits beside the
// table (Stats.Scheduled, NextDue, counted as pending) where no claim sees
// it, and is claimed, once due, no earlier than its NotBefore; the events
// written with it without a delay go at once.
func TestConformDelayedEventWaitsUntilDue(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		notBefore := time.Now().Add(1500 * time.Millisecond)
		written := addTx(t, db, s, outbox.Event{Type: "now"}, outbox.Event{Type: "later", Key: "k", Payload: []byte(`{"n":1}`), NotBefore: notBefore})

		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Scheduled)
		require.EqualValues(t, 2, st.Pending, "a delayed message is pending")
		require.WithinDuration(t, notBefore, st.NextDue, 500*time.Millisecond)
		g, err := s.Gauges(ctx, 0)
		require.NoError(t, err)
		require.EqualValues(t, 1, g.Scheduled)
		require.EqualValues(t, 2, g.Pending)
		n, err := s.Pending(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)

		require.NoError(t, s.Maintain(ctx))
		first, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, written[:1], ids(first), "only the event without a delay")
		require.NoError(t, s.MarkPublished(ctx, first...))

		later, at := claimDue(t, s, 10*time.Second)
		require.Equal(t, written[1:], ids(later))
		require.False(t, at.Before(notBefore), "claimed %s before its NotBefore", notBefore.Sub(at))
		require.Equal(t, "later", later[0].EventType)
		require.Equal(t, "k", later[0].Key)
		require.Equal(t, []byte(`{"n":1}`), later[0].Payload)
		require.NoError(t, s.MarkPublished(ctx, later...))
		st, err = s.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Scheduled)
		require.Zero(t, st.Pending)
		require.True(t, st.NextDue.IsZero())
	})
}

// Issue 42: a delayed event is written with its transaction or not at
// all; a NotBefore more than NotBeforeMax ahead is an error that writes
// nothing of the call; one in the past is now.
func TestConformDelayedEventBadInput(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		tx, err := db.Begin()
		require.NoError(t, err)
		require.NoError(t, s.Add(ctx, tx, outbox.Event{Type: "rolled.back", NotBefore: time.Now().Add(time.Hour)}))
		require.NoError(t, tx.Rollback())

		tx, err = db.Begin()
		require.NoError(t, err)
		err = s.Add(ctx, tx, outbox.Event{Type: "fine"}, outbox.Event{Type: "fine", NotBefore: time.Now().Add(time.Minute)},
			outbox.Event{Type: "too.far", NotBefore: time.Now().Add(outbox.NotBeforeMax + time.Hour)})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		require.ErrorContains(t, err, "event 3 of 3")
		require.ErrorContains(t, err, "more than NotBeforeMax")
		require.NoError(t, tx.Commit(), "nothing was written: the transaction goes on")
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Pending, "neither the rolled-back one nor any of the refused call")

		past := addTx(t, db, s, outbox.Event{Type: "past", NotBefore: time.Now().Add(-time.Hour)})
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, past, ids(msgs), "a NotBefore that has passed is now: no Maintain needed")
	})
}

// Issue 42: a due message whose ID was written into the table meanwhile
// is not moved (the table keeps one message per ID) and not lost: it
// stays counted as scheduled, and the others due with it are moved.
func TestConformDelayedEventWhoseIDWasWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		const id = "0190b4a2-7c3e-7000-8000-0000000000aa"
		due := time.Now().Add(300 * time.Millisecond)
		delayed := addTx(t, db, s, outbox.Event{ID: id, Type: "delayed", NotBefore: due}, outbox.Event{Type: "other", NotBefore: due})
		addTx(t, db, s, outbox.Event{ID: id, Type: "now"})
		first, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []string{id}, ids(first))
		require.Equal(t, "now", first[0].EventType)
		require.NoError(t, s.MarkPublished(ctx, first...))

		later, _ := claimDue(t, s, 10*time.Second)
		require.Equal(t, delayed[1:], ids(later), "the other one is moved")
		require.NoError(t, s.MarkPublished(ctx, later...))
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Scheduled, "the one not moved stays, for an operator")
		require.EqualValues(t, 1, st.Pending)
		require.True(t, st.NextDue.IsZero(), "it is not due again")
	})
}

// Issue 42: on an ordered table a delayed message takes its place in its
// key's order when it is due: it holds back nothing while it waits, goes
// out after the messages of its key committed before it fell due and
// before those committed after.
func TestConformDelayedEventOnOrderedTable(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, orderedCfg(nil), func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		a := addTx(t, db, s, outbox.Event{Type: "a", Key: "k", NotBefore: time.Now().Add(400 * time.Millisecond)})
		bb := addTx(t, db, s, outbox.Event{Type: "b", Key: "k"})
		require.NoError(t, s.Maintain(ctx))
		first, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, bb, ids(first), "the key is not held back by the delayed message")
		require.NoError(t, s.MarkPublished(ctx, first...))

		// Once a is due and moved, c, written after, comes after it.
		later, _ := claimDue(t, s, 10*time.Second)
		require.Equal(t, a, ids(later))
		c := addTx(t, db, s, outbox.Event{Type: "c", Key: "k"})
		more, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, more, "c waits behind a, in flight")
		require.NoError(t, s.MarkPublished(ctx, later...))
		require.Equal(t, c, claimAndPublish(t, s, 1))
	})
}

// Issue 42: operators list the delayed messages, the soonest due first,
// make one due now (the next Maintain moves it and a claim takes it) and
// discard another (never published); ids that are not UUIDs are refused.
func TestConformDelayedEventOperators(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		inAnHour, inTwo := time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
		written := addTx(t, db, s, outbox.Event{Type: "later", NotBefore: inTwo}, outbox.Event{Type: "soon", Key: "k", NotBefore: inAnHour})
		list, err := s.Scheduled(ctx, 10)
		require.NoError(t, err)
		require.Equal(t, []string{written[1], written[0]}, ids(list), "the soonest due first")
		require.WithinDuration(t, inAnHour, list[0].NotBefore, time.Minute)
		require.Equal(t, "soon", list[0].EventType)
		require.Equal(t, "k", list[0].Key)
		require.Empty(t, list[0].LastError)

		n, err := s.PublishNow(ctx, written[1], "0190b4a2-7c3e-7000-8000-0000000000ff")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the id that is no delayed message is left alone")
		got, _ := claimDue(t, s, 10*time.Second)
		require.Equal(t, written[1:], ids(got))
		require.NoError(t, s.MarkPublished(ctx, got...))

		n, err = s.DiscardScheduled(ctx, written[0])
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Pending)
		list, err = s.Scheduled(ctx, 10)
		require.NoError(t, err)
		require.Empty(t, list)

		_, err = s.PublishNow(ctx, "not-a-uuid")
		require.ErrorContains(t, err, "is not a message id")
		_, err = s.Scheduled(ctx, 0)
		require.ErrorContains(t, err, "limit must be at least 1")
	})
}

// Issue 42: a relay's MoveDue waits for the next delayed message's due
// time instead of polling a long delay: it says when that is, makes no
// statement before then (a message another process made due meanwhile
// waits for the next look), looks again at once when this store makes one
// due, and while something calls it, Maintain leaves the moving to it.
func TestConformDelayedMoveDueWaitsForTheNextDueTime(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		outbox.SetDueLook(s, time.Hour) // so that no look comes of time passing
		next, err := s.MoveDue(ctx)
		require.NoError(t, err)
		require.True(t, next.IsZero(), "nothing delayed: no due time")

		start := time.Now()
		written := addTx(t, db, s, outbox.Event{Type: "later", NotBefore: start.Add(time.Minute)})
		next, err = s.MoveDue(ctx)
		require.NoError(t, err)
		require.WithinDuration(t, start.Add(time.Minute), next, 5*time.Second, "the due time of the message delayed a minute")

		other, err := outbox.NewStore(db, &outbox.StoreConfig{Table: s.Table()})
		require.NoError(t, err)
		n, err := other.PublishNow(ctx, written...)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		again, err := s.MoveDue(ctx)
		require.NoError(t, err)
		require.Equal(t, next, again, "a look before the known due time")
		msgs, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, msgs, "moved before the store looked again")
		require.NoError(t, s.Maintain(ctx))
		msgs, err = s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, msgs, "Maintain moved it while MoveDue is being called")

		n, err = s.PublishNow(ctx, written...)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		next, err = s.MoveDue(ctx)
		require.NoError(t, err)
		require.True(t, next.IsZero(), "nothing left delayed")
		msgs, err = s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Equal(t, written, ids(msgs), "moved at once after this store made it due")
	})
}

// Issue 42: the delay runs from the statement that writes the event, not
// from the start of its transaction: in a transaction that began a while
// before Add, the message is due no earlier than its NotBefore. (It was
// due that while earlier on PostgreSQL, whose now() is the transaction's
// start, and went out before its NotBefore.)
func TestConformDelayedEventInALongTransaction(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()                      //nolint:errcheck
		_, err = tx.ExecContext(ctx, `SELECT 1`) // the transaction has begun, on the database too
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond) // the business work of a long transaction
		notBefore := time.Now().Add(100 * time.Millisecond)
		require.NoError(t, s.Add(ctx, tx, outbox.Event{Type: "later", NotBefore: notBefore}))
		require.NoError(t, tx.Commit())
		msgs, err := s.Scheduled(ctx, 10)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.False(t, msgs[0].NotBefore.Before(notBefore.Add(-time.Millisecond)),
			"due %s before its NotBefore", notBefore.Sub(msgs[0].NotBefore))
	})
}
