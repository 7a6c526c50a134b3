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

// Issue 44: FindParked filters the parked messages by type, key and a
// part of the last error, and pages through them from where the last
// page ended: every parked message once, the latest parked first, and
// none that is not parked.
func TestConformFindParkedFiltersAndPages(t *testing.T) {
	t.Parallel()
	cfg := func() *outbox.StoreConfig { return &outbox.StoreConfig{MaxAttempts: 1} }
	onEveryBackend(t, cfg, func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase) {
		ctx := context.Background()
		var evts []outbox.Event
		for i := range 7 {
			evts = append(evts, outbox.Event{Type: fmt.Sprintf("type-%d", i%2), Key: fmt.Sprintf("k%d", i%3)})
		}
		addTx(t, db, s, evts...)
		addTx(t, db, s, outbox.Event{Type: "type-0", Key: "k0"}) // stays ready
		msgs, err := s.Claim(ctx, 7, time.Minute)
		require.NoError(t, err)
		require.Len(t, msgs, 7)
		for i, m := range msgs {
			require.NoError(t, s.MarkFailed(ctx, m, fmt.Sprintf("broker said no <%d>", i%2)))
		}

		var seen []string
		q := outbox.ParkedQuery{Limit: 3}
		for page := 0; ; page++ {
			got, err := s.FindParked(ctx, q)
			require.NoError(t, err)
			if len(got) == 0 {
				break
			}
			require.LessOrEqual(t, len(got), 3)
			for i, m := range got {
				require.False(t, m.ParkedAt.IsZero(), "only parked messages")
				if i > 0 {
					require.False(t, m.ParkedAt.After(got[i-1].ParkedAt), "latest parked first")
				}
				seen = append(seen, m.ID)
			}
			q.After = &got[len(got)-1]
			require.Less(t, page, 5, "the pages do not end")
		}
		require.Len(t, seen, 7, "every parked message once: %v", seen)
		require.ElementsMatch(t, ids(msgs), seen)

		byType, err := s.FindParked(ctx, outbox.ParkedQuery{Limit: 100, EventType: "type-1"})
		require.NoError(t, err)
		require.Len(t, byType, 3)
		for _, m := range byType {
			require.Equal(t, "type-1", m.EventType)
		}
		byKey, err := s.FindParked(ctx, outbox.ParkedQuery{Limit: 100, EventType: "type-0", Key: "k0"})
		require.NoError(t, err)
		require.Len(t, byKey, 2, "type-0 and k0: messages 0 and 6")
		byErr, err := s.FindParked(ctx, outbox.ParkedQuery{Limit: 100, ErrorText: "no <1>"})
		require.NoError(t, err)
		require.Len(t, byErr, 3)
		for _, m := range byErr {
			require.Contains(t, m.LastError, "no <1>")
		}
		none, err := s.FindParked(ctx, outbox.ParkedQuery{Limit: 100, ErrorText: "%"})
		require.NoError(t, err)
		require.Empty(t, none, "the error text is matched as text, not as a pattern")

		_, err = s.FindParked(ctx, outbox.ParkedQuery{})
		require.ErrorContains(t, err, "limit")
		_, err = s.FindParked(ctx, outbox.ParkedQuery{Limit: 10, After: &outbox.Message{}})
		require.ErrorContains(t, err, "not a parked message")
	})
}
