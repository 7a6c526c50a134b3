package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// setupLayoutWith is setupLayout with a configuration.
func setupLayoutWith(t *testing.T, layout string, cfg *outbox.StoreConfig) *testBundle {
	t.Helper()
	if layout == "log" {
		return setupLog(t, cfg)
	}
	return setup(t, cfg)
}

// writeBySQL writes a message by SQL, as a program that bypasses Add
// would, with the given headers, and returns its id.
func (b *testBundle) writeBySQL(t *testing.T, key, headers string) string {
	t.Helper()
	id := uuid.NewString()
	_, err := b.db.ExecContext(context.Background(), `INSERT INTO "`+b.table+`" (id, event_type, event_key, payload, headers) VALUES ($1, 'bad', $2, '\x7b7d', $3::jsonb)`,
		id, key, headers)
	require.NoError(t, err)
	return id
}

// A row written by SQL that cannot be relayed as written (headers that do
// not decode into text values, or that Add refuses) is parked by the claim
// that finds it, with the reason in its last error; the claim returns the
// others. It was: every claim failed on it and nothing behind it moved.
func TestClaimParksARowItCannotRelay(t *testing.T) {
	for _, layout := range []string{"rows", "log"} {
		for _, c := range []struct{ name, headers, reason string }{
			{"number", `{"retry": 1}`, "cannot unmarshal number"},
			{"bool", `{"retry": true}`, "cannot unmarshal bool"},
			{"object", `{"retry": {"n": "1"}}`, "cannot unmarshal object"},
			{"array", `{"retry": ["1"]}`, "cannot unmarshal array"},
			{"not an object", `["a"]`, "cannot unmarshal array"},
			{"empty name", `{"": "x"}`, "a header name is empty"},
			{"key header", `{"x-event-key": "forged"}`, `header "x-event-key" is reserved`},
		} {
			t.Run(layout+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				b := setupLayoutWith(t, layout, &outbox.StoreConfig{Backoff: func(int) time.Duration { return 0 }})
				b.addCommitted(t, events(3)...)
				bad := b.writeBySQL(t, "", c.headers)
				b.addCommitted(t, events(3)...)

				msgs, err := b.store.Claim(ctx, 10, time.Hour)
				require.NoError(t, err)
				require.Len(t, msgs, 6, "the others")
				require.NotContains(t, ids(msgs), bad)
				require.NoError(t, b.store.MarkPublished(ctx, msgs...))

				parked, err := b.store.Parked(ctx, 10)
				require.NoError(t, err)
				require.Len(t, parked, 1)
				require.Equal(t, bad, parked[0].ID)
				require.Contains(t, parked[0].LastError, c.reason)
				require.Contains(t, parked[0].LastError, "cannot be relayed as written")
				st, err := b.store.Stats(ctx)
				require.NoError(t, err)
				require.Zero(t, st.Ready)
				require.EqualValues(t, 1, st.Parked)
				require.EqualValues(t, 1, st.Pending, "a parked message is pending (issue 38, item 1)")
				msgs, err = b.store.Claim(ctx, 10, time.Hour)
				require.NoError(t, err)
				require.Empty(t, msgs)

				// Retried as it is, it is parked again by the claim
				// that takes it (on the log layout, from the failed
				// table).
				n, err := b.store.Retry(ctx, bad)
				require.NoError(t, err)
				require.EqualValues(t, 1, n)
				msgs, err = b.store.Claim(ctx, 10, time.Hour)
				require.NoError(t, err)
				require.Empty(t, msgs)
				parked, err = b.store.Parked(ctx, 10)
				require.NoError(t, err)
				require.Len(t, parked, 1)
				require.Equal(t, bad, parked[0].ID)
			})
		}
	}
}

// On an ordered table, the later messages of a parked row's key wait
// behind it, as behind a message parked after its attempts; the other
// keys go on. Discarding it lets them out.
func TestClaimParksARowItCannotRelayOrdered(t *testing.T) {
	for _, layout := range []string{"rows", "log"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setupLayoutWith(t, layout, &outbox.StoreConfig{Ordering: outbox.OrderedByKey})
			b.addCommitted(t, outbox.Event{Type: "first", Key: "a"})
			bad := b.writeBySQL(t, "a", `{"n": 1}`)
			b.addCommitted(t, outbox.Event{Type: "behind", Key: "a"}, outbox.Event{Type: "other", Key: "b"})

			msgs, err := b.store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			var types []string
			for _, m := range msgs {
				types = append(types, m.EventType)
			}
			require.ElementsMatch(t, []string{"first", "other"}, types, "not the message behind the parked one")
			require.NoError(t, b.store.MarkPublished(ctx, msgs...))
			msgs, err = b.store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Empty(t, msgs, "it waits behind the parked one")

			n, err := b.store.Discard(ctx, bad)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			msgs, err = b.store.Claim(ctx, 10, time.Hour)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			require.Equal(t, "behind", msgs[0].EventType)
		})
	}
}
