package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// world is one test's queue (dead-lettering to a queue of its own), inbox
// table and effects table.
type world struct {
	mysql      bool   // on MariaDB (or MySQL), not PostgreSQL
	dsn        string // the MySQL database's
	db         *sql.DB
	ib         *inbox.Inbox
	table      string
	ch         *amqp.Channel
	queue, dlq string
	deliveries <-chan amqp.Delivery
}

func setup(t *testing.T, maxAttempts int) *world {
	t.Helper()
	return setupOn(t, maxAttempts, false)
}

// databases runs fn as a subtest on PostgreSQL and on MariaDB, each with a
// world of its own.
func databases(t *testing.T, maxAttempts int, fn func(t *testing.T, w *world)) {
	for _, c := range []struct {
		name  string
		mysql bool
	}{{"postgres", false}, {"mysql", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fn(t, setupOn(t, maxAttempts, c.mysql))
		})
	}
}

// setupOn is setup on PostgreSQL or, with mysql, on MariaDB (a database of
// the test's own, table "inbox").
func setupOn(t *testing.T, maxAttempts int, mysql bool) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{mysql: mysql}
	if mysql {
		w.dsn, w.table = mysqltest.DSN(t), "inbox"
		var err error
		w.db, err = sql.Open("mysql", w.dsn)
		require.NoError(t, err)
		t.Cleanup(func() { w.db.Close() })
	} else {
		w.db, w.table = dbtest.DB(t), dbtest.Table(t)
	}
	var err error
	w.ib, err = inbox.New(w.db, &inbox.Config{Consumer: "billing", Table: w.table, MaxAttempts: maxAttempts, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, w.ib.CreateSchemaIfAbsent(ctx))
	_, err = w.db.Exec(w.sql(`CREATE TABLE "` + w.table + `_effects" (message_id varchar(255) NOT NULL)`))
	require.NoError(t, err)

	conn := amqptest.Conn(t)
	w.ch, err = conn.Channel()
	require.NoError(t, err)
	w.queue, w.dlq = amqptest.Name(t, "q"), amqptest.Name(t, "dlq")
	_, err = w.ch.QueueDeclare(w.dlq, false, false, false, false, nil)
	require.NoError(t, err)
	_, err = w.ch.QueueDeclare(w.queue, false, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": w.dlq})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = w.ch.QueueDelete(w.queue, false, false, false)
		_, _ = w.ch.QueueDelete(w.dlq, false, false, false)
	})
	w.deliveries, err = w.ch.Consume(w.queue, testConsumerTag, false, false, false, false, nil)
	require.NoError(t, err)
	return w
}

func (w *world) publish(t *testing.T, id string) {
	t.Helper()
	require.NoError(t, w.ch.PublishWithContext(context.Background(), "", w.queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`)}))
}

func (w *world) next(t *testing.T) *amqp.Delivery {
	t.Helper()
	select {
	case d := <-w.deliveries:
		return &d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
		return nil
	}
}

// effect is the handler's write, in the inbox's transaction.
func (w *world) effect(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
	_, err := tx.ExecContext(ctx, w.sql(`INSERT INTO "`+w.table+`_effects" VALUES ($1)`), d.MessageId)
	return err
}

func (w *world) effects(t *testing.T) int64 {
	return dbtest.Count(t, w.db, w.sql(`SELECT count(*) FROM "`+w.table+`_effects"`))
}

// sql is query in the world's database's dialect: on MySQL its quoted
// names in backquotes, its placeholders ?, now() UTC_TIMESTAMP(6) and
// intervals MySQL's.
func (w *world) sql(query string) string {
	if !w.mysql {
		return query
	}
	query = strings.ReplaceAll(query, `"`, "`")
	query = regexp.MustCompile(`\$\d+`).ReplaceAllString(query, "?")
	query = strings.ReplaceAll(query, "now()", "UTC_TIMESTAMP(6)")
	return regexp.MustCompile(`interval '(\d+) days'`).ReplaceAllString(query, "INTERVAL $1 DAY")
}

func (w *world) queued(t *testing.T, queue string) int {
	t.Helper()
	q, err := w.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// Issue 12: the same message delivered 3 times has its effect once, and
// every delivery is acked.
func TestSameMessageThreeTimesAppliedOnce(t *testing.T) {
	t.Parallel()
	databases(t, 0, func(t *testing.T, w *world) {
		ctx := context.Background()
		for range 3 {
			w.publish(t, "msg-1")
		}
		var outcomes []inbox.Outcome
		for range 3 {
			o, err := w.ib.Handle(ctx, w.next(t), w.effect)
			require.NoError(t, err)
			outcomes = append(outcomes, o)
		}
		require.Equal(t, []inbox.Outcome{inbox.Handled, inbox.Duplicate, inbox.Duplicate}, outcomes)
		require.EqualValues(t, 1, w.effects(t))
		require.Eventually(t, func() bool { return w.queued(t, w.queue) == 0 }, 5*time.Second, 10*time.Millisecond)
		require.Zero(t, w.queued(t, w.dlq))
	})
}

// Issue 12: a handler that fails twice, then succeeds, applies its effect
// once: the failed attempts are rolled back and counted in the database.
func TestFailsTwiceThenSucceedsAppliedOnce(t *testing.T) {
	t.Parallel()
	databases(t, 5, func(t *testing.T, w *world) {
		ctx := context.Background()
		w.publish(t, "msg-2")
		calls := 0
		flaky := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			if err := w.effect(ctx, tx, d); err != nil {
				return err
			}
			if calls++; calls <= 2 {
				return errors.New("downstream timeout")
			}
			return nil
		}
		for i := range 3 {
			d := w.next(t)
			o, err := w.ib.Handle(ctx, d, flaky)
			if i < 2 {
				require.Equal(t, inbox.Retried, o)
				require.ErrorContains(t, err, "downstream timeout")
			} else {
				require.Equal(t, inbox.Handled, o)
				require.NoError(t, err)
				require.True(t, d.Redelivered)
			}
		}
		require.EqualValues(t, 1, w.effects(t), "the failed attempts' writes were rolled back")
		var attempts int
		require.NoError(t, w.db.QueryRow(w.sql(`SELECT attempts FROM "`+w.table+`" WHERE message_id = 'msg-2'`)).Scan(&attempts))
		require.Equal(t, 2, attempts)
	})
}

// Issue 12: a handler that always fails dead-letters the message after
// MaxAttempts, with the error recorded and nothing applied.
func TestAlwaysFailsDeadLettered(t *testing.T) {
	t.Parallel()
	databases(t, 3, func(t *testing.T, w *world) {
		ctx := context.Background()
		w.publish(t, "msg-3")
		broken := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			if err := w.effect(ctx, tx, d); err != nil {
				return err
			}
			return errors.New("invalid invoice: total is negative")
		}
		var outcomes []inbox.Outcome
		for range 3 {
			o, err := w.ib.Handle(ctx, w.next(t), broken)
			require.ErrorContains(t, err, "total is negative")
			outcomes = append(outcomes, o)
		}
		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Retried, inbox.DeadLettered}, outcomes)
		require.Zero(t, w.effects(t))
		var lastError string
		var dead bool
		require.NoError(t, w.db.QueryRow(w.sql(`SELECT last_error, dead_at IS NOT NULL FROM "`+w.table+`" WHERE message_id = 'msg-3'`)).Scan(&lastError, &dead))
		require.True(t, dead)
		require.Equal(t, "invalid invoice: total is negative", lastError)
		require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 5*time.Second, 10*time.Millisecond, "the dead-letter queue has it")
		require.Zero(t, w.queued(t, w.queue))
	})
}

// Issue 12: a message without a message-id is refused, never handled.
func TestNoMessageIDRefused(t *testing.T) {
	t.Parallel()
	databases(t, 0, func(t *testing.T, w *world) {
		w.publish(t, "")
		o, err := w.ib.Handle(context.Background(), w.next(t), w.effect)
		require.Equal(t, inbox.Refused, o)
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		require.Zero(t, w.effects(t))
		require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 5*time.Second, 10*time.Millisecond)
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	_, err := inbox.New(db, &inbox.Config{})
	require.ErrorContains(t, err, "Consumer is required")
	_, err = inbox.New(nil, &inbox.Config{Consumer: "c"})
	require.ErrorContains(t, err, "db is nil")
	_, err = inbox.New(db, &inbox.Config{Consumer: "c", Table: `x"; DROP TABLE y`})
	require.ErrorIs(t, err, inbox.ErrInvalidTable)
	ddl, err := inbox.Schema("billing.inbox")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ddl, `CREATE TABLE IF NOT EXISTS "billing"."inbox"`), ddl)
}

// testConsumerTag names the test's own consumer, so a test can cancel it.
const testConsumerTag = "inbox-test"

// Issue 12, item 5: purging keeps what is recent, still failing, or
// another consumer's.
func TestPurge(t *testing.T) {
	t.Parallel()
	databases(t, 5, func(t *testing.T, w *world) {
		ctx := context.Background()
		other, err := inbox.New(w.db, &inbox.Config{Consumer: "shipping", Table: w.table})
		require.NoError(t, err)
		_, err = w.db.Exec(w.sql(`INSERT INTO "` + w.table + `" (consumer, message_id, received_at, handled_at, attempts, dead_at) VALUES
			('billing', 'old-handled', now() - interval '10 days', now(), 0, NULL),
			('billing', 'old-dead', now() - interval '10 days', NULL, 5, now()),
			('billing', 'old-failing', now() - interval '10 days', NULL, 2, NULL),
			('billing', 'new-handled', now(), now(), 0, NULL),
			('shipping', 'old-handled', now() - interval '10 days', now(), 0, NULL)`))
		require.NoError(t, err)
		n, err := w.ib.Purge(ctx, 7*24*time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		require.EqualValues(t, 3, dbtest.Count(t, w.db, w.sql(`SELECT count(*) FROM "`+w.table+`"`)))
		n, err = other.Purge(ctx, 7*24*time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = w.ib.Purge(ctx, -time.Second)
		require.Error(t, err)
	})
}

// Issue 12: two consumers share one inbox table; each deduplicates on its
// own, so both apply the same message once.
func TestTwoConsumersShareATable(t *testing.T) {
	t.Parallel()
	databases(t, 0, func(t *testing.T, w *world) {
		ctx := context.Background()
		shipping, err := inbox.New(w.db, &inbox.Config{Consumer: "shipping", Table: w.table})
		require.NoError(t, err)
		w.publish(t, "shared")
		w.publish(t, "shared")
		d1, d2 := w.next(t), w.next(t)
		o, err := w.ib.Handle(ctx, d1, w.effect)
		require.NoError(t, err)
		require.Equal(t, inbox.Handled, o)
		o, err = shipping.Handle(ctx, d2, w.effect)
		require.NoError(t, err)
		require.Equal(t, inbox.Handled, o, "billing's record does not stop shipping")
		require.EqualValues(t, 2, w.effects(t))
	})
}
