package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// Issue 42: the relay publishes a delayed event no earlier than its
// NotBefore (its Maintain moves it into the table once due), and the
// events written beside it without a delay at once; on PostgreSQL (the
// layout OUTBOX_TEST_LAYOUT names) and on MySQL/MariaDB.
func TestRelayPublishesDelayedEventsWhenDue(t *testing.T) {
	t.Parallel()
	for _, mysql := range []bool{false, true} {
		name := "postgres"
		if mysql {
			name = "mysql"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var (
				mu      sync.Mutex
				arrived = map[string]time.Time{}
			)
			record := func(d amqp.Delivery) {
				mu.Lock()
				defer mu.Unlock()
				if _, ok := arrived[d.MessageId]; !ok {
					arrived[d.MessageId] = time.Now()
				}
			}
			var b *testBundle
			if mysql {
				b, _ = mysqlSetupFunc(t, nil, record)
			} else {
				b = setupFunc(t, nil, record)
			}
			start(t, b.store, newPublisher(t, nil), &relay.Config{})

			const n = 20
			ctx := context.Background()
			notBefore := map[string]time.Time{}
			for i := range n {
				tx, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				at := time.Now().Add(time.Duration(300+60*i) * time.Millisecond)
				ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "delayed", NotBefore: at}, outbox.Event{Type: "now"})
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
				notBefore[ids[0]] = at
			}
			require.Eventually(t, func() bool { return b.consumer.Distinct() == 2*n }, time.Minute, 10*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			for id, at := range notBefore {
				require.False(t, arrived[id].Before(at), "published %s before its NotBefore", at.Sub(arrived[id]))
			}
			st, err := b.store.Stats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Scheduled)
		})
	}
}
