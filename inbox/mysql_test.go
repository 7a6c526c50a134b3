package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
)

// Issue 41: on MySQL/MariaDB, a handler whose session is killed (KILL
// CONNECTION, as an operator or a failover would) 5 times in a row is
// applied exactly once when the database is healthy again; no attempt is
// counted, so MaxAttempts 3 dead-letters nothing.
func TestMySQLSessionKilledCountsNoAttempt(t *testing.T) {
	t.Parallel()
	w := setupOn(t, 3, true)
	var kills atomic.Int32
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if kills.Add(1) <= 5 {
			var id int64
			if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
			return fmt.Errorf("charging the card: %w", err)
		}
		return w.effect(ctx, tx, d)
	}
	c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: handler, BackoffMax: 200 * time.Millisecond})
	w.publish(t, "good")
	require.Eventually(t, func() bool { return w.effects(t) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return c.Stats().Handled == 1 }, 10*time.Second, 10*time.Millisecond)
	st := c.Stats()
	require.EqualValues(t, 5, st.Requeued, "every killed session requeued the delivery: %+v", st)
	require.Zero(t, st.Retried+st.DeadLettered, "%+v", st)
	var attempts int
	require.NoError(t, w.db.QueryRow("SELECT attempts FROM inbox WHERE message_id = 'good'").Scan(&attempts))
	require.Zero(t, attempts)
	require.Zero(t, w.queued(t, w.dlq))
}

// Issue 41: dead-lettered records on MySQL are listed with their times,
// counted, and re-armed.
func TestMySQLDeadRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setupOn(t, 1, true)
	w.publish(t, "bad")
	o, err := w.ib.Handle(ctx, w.next(t), func(context.Context, *sql.Tx, *amqp.Delivery) error { return fmt.Errorf("no such invoice") })
	require.Error(t, err)
	require.Equal(t, inbox.DeadLettered, o)
	dead, err := w.ib.Dead(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "bad", dead[0].MessageID)
	require.Equal(t, "no such invoice", dead[0].LastError)
	require.WithinDuration(t, time.Now(), dead[0].DeadAt, time.Minute)
	require.WithinDuration(t, time.Now(), dead[0].ReceivedAt, time.Minute)
	n, err := w.ib.DeadAmong(ctx, "bad", "bad", "unknown")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = w.ib.Retry(ctx, "bad")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	recs, err := w.ib.Records(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.Records{Failing: 1}, recs)
}

// Issue 44: the dead-lettered records are paged from where the last page
// ended, the oldest dead first, each once, on PostgreSQL and MySQL.
func TestFindDeadPages(t *testing.T) {
	for _, mysql := range []bool{false, true} {
		t.Run(map[bool]string{false: "postgres", true: "mysql"}[mysql], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			w := setupOn(t, 1, mysql)
			for i := range 5 {
				w.publish(t, fmt.Sprintf("bad-%d", i))
				_, err := w.ib.Handle(ctx, w.next(t), func(context.Context, *sql.Tx, *amqp.Delivery) error { return fmt.Errorf("no such invoice") })
				require.Error(t, err)
			}
			var seen []inbox.DeadRecord
			q := inbox.DeadQuery{Limit: 2}
			for page := 0; ; page++ {
				got, err := w.ib.FindDead(ctx, q)
				require.NoError(t, err)
				if len(got) == 0 {
					break
				}
				require.LessOrEqual(t, len(got), 2)
				seen = append(seen, got...)
				q.After = &got[len(got)-1]
				require.Less(t, page, 4, "the pages do not end")
			}
			require.Len(t, seen, 5)
			for i := 1; i < len(seen); i++ {
				a, b := seen[i-1], seen[i]
				require.True(t, a.DeadAt.Before(b.DeadAt) || (a.DeadAt.Equal(b.DeadAt) && a.MessageID < b.MessageID), "the oldest dead first")
			}
			_, err := w.ib.FindDead(ctx, inbox.DeadQuery{Limit: 1, After: &inbox.DeadRecord{}})
			require.ErrorContains(t, err, "not a dead record")
		})
	}
}
