package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Issue 47, item 12: messages released by a relay (a broker fault, a
// shutdown) are ready again at once, on every layout: no view counts them
// in flight until their lease would have ended.
func TestReleasedMessagesAreReadyAtOnce(t *testing.T) {
	for layout, b := range map[string]*testBundle{"rows": setup(t, nil), "log": setupLog(t, nil)} {
		t.Run(layout, func(t *testing.T) {
			ctx := context.Background()
			b.addCommitted(t, events(3)...)
			msgs, err := b.store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Len(t, msgs, 3)
			st, err := b.store.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, [3]int64{3, 0, 3}, [3]int64{st.Pending, st.Ready, st.InFlight}, "claimed")
			require.NoError(t, b.store.Release(ctx, msgs...))
			st, err = b.store.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, [3]int64{3, 3, 0}, [3]int64{st.Pending, st.Ready, st.InFlight}, "released: ready again, not in flight")
			g, err := b.store.Gauges(ctx, 1000)
			require.NoError(t, err)
			require.Equal(t, [3]int64{3, 3, 0}, [3]int64{g.Pending, g.Ready, g.InFlight}, "the gauges agree")
			again, err := b.store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Len(t, again, 3, "and claimable")
		})
	}
}
