package outbox_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// claimUntil claims until the messages with the payloads want have all been
// claimed (a log store looks for failed messages due again now and then),
// and returns them; nothing else may be claimed meanwhile.
func claimUntil(t *testing.T, s *outbox.Store, want ...string) []outbox.Message {
	t.Helper()
	var got []outbox.Message
	require.Eventually(t, func() bool {
		msgs, payloads := claimed(t, s, 10)
		for i, pl := range payloads {
			require.Contains(t, want, pl, "claimed what the test did not ask for")
			got = append(got, msgs[i])
		}
		return len(got) == len(want)
	}, 10*time.Second, 10*time.Millisecond)
	slices.SortFunc(got, func(a, b outbox.Message) int { return int(a.Seq - b.Seq) })
	return got
}

// Issue 38, item 1: the store's contract counts as pending "how many
// messages are waiting to be published, including those currently claimed
// and those that have exhausted their attempts". On every layout and mode,
// claimed, backing-off, held and parked messages are all in Pending, and
// each of the views beside it counts what it says.
func TestPendingCountsEveryWaitingMessage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		layout  string
		ordered bool
	}{{"rows", false}, {"rows", true}, {"log", false}, {"log", true}} {
		name := c.layout
		if c.ordered {
			name += "/ordered"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var delay atomic.Bool // the backoff of the next failure: none, or an hour
			cfg := &outbox.StoreConfig{MaxAttempts: 2, Backoff: func(int) time.Duration {
				if delay.Load() {
					return time.Hour
				}
				return 0
			}}
			if c.ordered {
				cfg.Ordering = outbox.OrderedByKey
			}
			b := setupLayoutWith(t, c.layout, cfg)

			// p1 fails twice and is parked; d1 fails once and backs off
			// for an hour.
			b.addCommitted(t, keyed("p", 1), keyed("d", 1))
			first := claimUntil(t, b.store, p("p", 1), p("d", 1))
			require.NoError(t, b.store.MarkFailed(ctx, first[0], "NO_ROUTE"))
			delay.Store(true)
			require.NoError(t, b.store.MarkFailed(ctx, first[1], "NO_ROUTE"))
			again := claimUntil(t, b.store, p("p", 1))
			require.NoError(t, b.store.MarkFailed(ctx, again[0], "NO_ROUTE"))
			parked, err := b.store.Parked(ctx, 10)
			require.NoError(t, err)
			require.Equal(t, []string{first[0].ID}, ids(parked))

			// c1 is claimed (in flight).
			b.addCommitted(t, keyed("c", 1))
			claimUntil(t, b.store, p("c", 1))

			// On an ordered table p2 is held behind its parked key: a
			// claim sets it aside (log) or Reconcile holds it (rows).
			want := outbox.Stats{Ready: 1, InFlight: 1, Claimed: 1, Delayed: 1, Parked: 1, BlockedKeys: 1}
			if c.ordered {
				b.addCommitted(t, keyed("p", 2))
				_, got := claimed(t, b.store, 10)
				require.Empty(t, got, "p2 waits behind p1")
				_, _, err := b.store.Reconcile(ctx)
				require.NoError(t, err)
				want.Held = 1
			}

			// r1 is ready: nothing claimed it yet.
			b.addCommitted(t, keyed("r", 1))
			want.Pending = want.Ready + want.InFlight + want.Delayed + want.Held + want.Parked

			pending, err := b.store.Pending(ctx)
			require.NoError(t, err)
			require.Equal(t, want.Pending, pending, "Store.Pending: claimed, backing off, held and parked are all waiting to be published")
			st, err := b.store.Stats(ctx)
			require.NoError(t, err)
			require.Positive(t, st.OldestReadyAge, "r1 is ready")
			require.GreaterOrEqual(t, st.OldestPendingAge, st.OldestReadyAge, "p1, parked, is older than r1")
			want.OldestPendingAge, want.OldestReadyAge, want.PublishedLastHour = st.OldestPendingAge, st.OldestReadyAge, st.PublishedLastHour
			require.Equal(t, want, st)

			g, err := b.store.Gauges(ctx, 0)
			require.NoError(t, err)
			require.Equal(t, [6]int64{want.Pending, want.Ready, want.InFlight, want.Delayed, want.Held, want.Parked},
				[6]int64{g.Pending, g.Ready, g.InFlight, g.Delayed, g.Held, g.Parked}, "Gauges count as Stats does")
			require.InDelta(t, st.OldestPendingAge.Seconds(), g.OldestPendingAge.Seconds(), 0.5)
			require.InDelta(t, st.OldestReadyAge.Seconds(), g.OldestReadyAge.Seconds(), 0.5)

			// Claimed, r1 moves from ready to in flight: nothing is ready.
			claimUntil(t, b.store, p("r", 1))
			st, err = b.store.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, [4]int64{want.Pending, 0, 2, 1}, [4]int64{st.Pending, st.Ready, st.InFlight, st.Parked})
			require.Zero(t, st.OldestReadyAge, "nothing is ready")
			require.Positive(t, st.OldestPendingAge)
		})
	}
}
