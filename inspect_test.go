package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// Issue 44: what the console shows beside the counts, on every backend.
// A parked message blocks its key (its later messages are held), a claim
// is listed as a live lease until it is settled, a key's queue lists its
// messages in order with their states, and what is published is counted
// in the current minute.
func TestConformInspections(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, orderedCfg(&outbox.StoreConfig{MaxAttempts: 1}), func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		addTx(t, db, s, outbox.Event{Type: "t", Key: "a"})
		head, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, head, 1)
		require.NoError(t, s.MarkFailed(ctx, head[0], "no route"))
		addTx(t, db, s, outbox.Event{Type: "t", Key: "a"}, outbox.Event{Type: "t", Key: "a"}, outbox.Event{Type: "t", Key: "b"}, outbox.Event{Type: "t"})
		_, _, err = s.Reconcile(ctx)
		require.NoError(t, err)
		claimed, err := s.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 2, "b's and the unkeyed one: a is blocked")

		leases, err := s.Leases(ctx, 10)
		require.NoError(t, err)
		require.Len(t, leases, 1, "%+v", leases)
		require.Equal(t, int64(2), leases[0].Messages)
		require.NotEmpty(t, leases[0].Claim)
		require.True(t, leases[0].Until.After(time.Now().Add(30*time.Second)), "the lease of a minute: %v", leases[0].Until)

		keys, err := s.BlockedKeys(ctx, 10)
		require.NoError(t, err)
		require.Len(t, keys, 1, "%+v", keys)
		require.Equal(t, "a", keys[0].Key)
		require.Equal(t, int64(1), keys[0].Parked)
		require.Equal(t, int64(2), keys[0].Held)
		require.WithinDuration(t, time.Now(), keys[0].Since, time.Minute)

		queue, err := s.KeyQueue(ctx, "a", 10)
		require.NoError(t, err)
		require.Len(t, queue, 3)
		require.Equal(t, head[0].ID, queue[0].ID, "the parked head first")
		require.Equal(t, []outbox.MessageState{outbox.StateParked, outbox.StateHeld, outbox.StateHeld},
			[]outbox.MessageState{queue[0].State, queue[1].State, queue[2].State})
		require.Less(t, queue[1].Seq, queue[2].Seq, "in their order")
		require.Equal(t, "no route", queue[0].LastError)
		bq, err := s.KeyQueue(ctx, "b", 10)
		require.NoError(t, err)
		if b.log {
			require.Empty(t, bq, "the log layout lists only what failed or waits behind it")
		} else {
			require.Len(t, bq, 1)
			require.Equal(t, outbox.StateInFlight, bq[0].State)
		}

		held, err := s.FindHeld(ctx, outbox.HeldQuery{Limit: 10})
		require.NoError(t, err)
		require.Equal(t, []string{queue[1].ID, queue[2].ID}, ids(held), "the two behind the parked head, in order")
		first, err := s.FindHeld(ctx, outbox.HeldQuery{Limit: 1, Key: "a"})
		require.NoError(t, err)
		require.Equal(t, []string{queue[1].ID}, ids(first))
		next, err := s.FindHeld(ctx, outbox.HeldQuery{Limit: 10, Key: "a", After: &first[0]})
		require.NoError(t, err)
		require.Equal(t, []string{queue[2].ID}, ids(next), "the next page")
		none, err := s.FindHeld(ctx, outbox.HeldQuery{Limit: 10, Key: "b"})
		require.NoError(t, err)
		require.Empty(t, none)
		none, err = s.FindHeld(ctx, outbox.HeldQuery{Limit: 10, CreatedBefore: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.Empty(t, none, "none written an hour ago")

		before, err := s.PublishedByMinute(ctx, 60)
		require.NoError(t, err)
		require.Len(t, before, 60)
		require.Equal(t, int64(0), sum(before))
		require.NoError(t, s.MarkPublished(ctx, claimed...))
		after, err := s.PublishedByMinute(ctx, 60)
		require.NoError(t, err)
		require.Equal(t, int64(2), after[0], "%v", after)
		require.Equal(t, int64(2), sum(after))
		leases, err = s.Leases(ctx, 10)
		require.NoError(t, err)
		require.Empty(t, leases, "a settled claim is not live")

		_, err = s.Leases(ctx, 0)
		require.ErrorContains(t, err, "limit")
		_, err = s.KeyQueue(ctx, "", 10)
		require.ErrorContains(t, err, "empty")
		_, err = s.BlockedKeys(ctx, outbox.InspectMax+1)
		require.ErrorContains(t, err, "limit")
		_, err = s.PublishedByMinute(ctx, 0)
		require.ErrorContains(t, err, "minutes")
	})
}

func sum(n []int64) (s int64) {
	for _, v := range n {
		s += v
	}
	return s
}

// Issue 44: FindScheduled filters the delayed messages by type and key and
// pages through them from where the last page ended: every delayed
// message once, the soonest due first, on every backend.
func TestConformFindScheduledFiltersAndPages(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		var evts []outbox.Event
		base := time.Now().Add(time.Hour)
		for i := range 7 {
			// Two share each due time but the last: ties are broken by id.
			evts = append(evts, outbox.Event{Type: []string{"remind", "expire"}[i%2], Key: []string{"k0", "k1", "k2"}[i%3],
				NotBefore: base.Add(time.Duration(i/2) * time.Minute)})
		}
		written := addTx(t, db, s, evts...)
		addTx(t, db, s, outbox.Event{Type: "now"})

		var seen []outbox.Message
		q := outbox.ScheduledQuery{Limit: 3}
		for page := 0; ; page++ {
			got, err := s.FindScheduled(ctx, q)
			require.NoError(t, err)
			if len(got) == 0 {
				break
			}
			require.LessOrEqual(t, len(got), 3)
			seen = append(seen, got...)
			q.After = &got[len(got)-1]
			require.Less(t, page, 5, "the pages do not end")
		}
		require.Len(t, seen, 7, "every delayed message once")
		require.ElementsMatch(t, written, ids(seen))
		for i := 1; i < len(seen); i++ {
			a, b := seen[i-1], seen[i]
			require.True(t, a.NotBefore.Before(b.NotBefore) || (a.NotBefore.Equal(b.NotBefore) && a.ID < b.ID),
				"soonest due first, then by id: %v %s, %v %s", a.NotBefore, a.ID, b.NotBefore, b.ID)
		}

		byType, err := s.FindScheduled(ctx, outbox.ScheduledQuery{Limit: 100, EventType: "expire"})
		require.NoError(t, err)
		require.Len(t, byType, 3)
		byKey, err := s.FindScheduled(ctx, outbox.ScheduledQuery{Limit: 100, EventType: "remind", Key: "k0"})
		require.NoError(t, err)
		require.Len(t, byKey, 2, "events 0 and 6")

		_, err = s.FindScheduled(ctx, outbox.ScheduledQuery{})
		require.ErrorContains(t, err, "limit")
		_, err = s.FindScheduled(ctx, outbox.ScheduledQuery{Limit: 1, After: &outbox.Message{ID: "x"}})
		require.ErrorContains(t, err, "not a delayed message")
	})
}

// Issue 44: SchemaVersion names the newest migration a table has: the
// latest on a table made today, one less once the table of delayed
// messages (the last migration on every backend) is dropped.
func TestConformSchemaVersion(t *testing.T) {
	t.Parallel()
	onEveryBackend(t, nil, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		v, latest, err := s.SchemaVersion(ctx)
		require.NoError(t, err)
		want := map[bool]int{false: 3, true: 2}[b.log || b.mysql]
		require.Equal(t, want, latest)
		require.Equal(t, latest, v)
		drop := "DROP TABLE " + s.Table() + "_scheduled"
		if b.mysql {
			drop = "DROP TABLE `" + s.Table() + "_scheduled`"
		}
		_, err = db.ExecContext(ctx, drop)
		require.NoError(t, err)
		v, _, err = s.SchemaVersion(ctx)
		require.NoError(t, err)
		require.Equal(t, latest-1, v)
	})
}
