package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/topology"
)

// run starts a consumer of the world's queue (the test's own consumer
// cancelled) and stops it when the test ends.
func (w *world) run(t *testing.T, ib *inbox.Inbox, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	require.NoError(t, w.ch.Cancel(testConsumerTag, false))
	cfg.Queue, cfg.URLs = w.queue, []string{amqptest.URL()}
	if cfg.Logger == nil {
		cfg.Logger = dbtest.Logger(t)
	}
	c, err := ib.Consumer(&cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return c
}

func (w *world) attempts(t *testing.T, id string) (attempts int, dead bool) {
	t.Helper()
	require.NoError(t, w.db.QueryRow(`SELECT attempts, dead_at IS NOT NULL FROM "`+w.table+`" WHERE message_id = $1`, id).Scan(&attempts, &dead))
	return attempts, dead
}

// lines is a log a test can count lines of.
type lines struct{ dbtest.Buffer }

func (l *lines) count(substr string) int { return strings.Count(l.String(), substr) }

func (l *lines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// Issue 17, item 1: a handler whose database session is terminated 10
// times in a row is applied exactly once when the database is healthy
// again; no attempt is counted, so MaxAttempts 3 dead-letters nothing.
func TestDatabaseFailureCountsNoAttempt(t *testing.T) {
	t.Parallel()
	w := setup(t, 3)
	var kills atomic.Int32
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if kills.Add(1) <= 10 {
			_, err := tx.ExecContext(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return fmt.Errorf("charging the card: %w", err)
		}
		return w.effect(ctx, tx, d)
	}
	c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: handler, BackoffMax: 200 * time.Millisecond})
	w.publish(t, "good")
	require.Eventually(t, func() bool { return w.effects(t) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return c.Stats().Handled == 1 }, 10*time.Second, 10*time.Millisecond)
	st := c.Stats()
	require.EqualValues(t, 10, st.Requeued, "every terminated session requeued the delivery: %+v", st)
	require.Zero(t, st.Retried+st.DeadLettered, "%+v", st)
	attempts, dead := w.attempts(t, "good")
	require.Zero(t, attempts)
	require.False(t, dead)
	require.Zero(t, w.queued(t, w.dlq))
}

// Issue 17, item 1: a serialization failure or deadlock is run again at
// once, within the same Handle, without counting an attempt.
func TestSerializationFailureRetriedAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, 0)
	w.publish(t, "racy")
	calls := 0
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if calls++; calls <= 2 {
			_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'lost a race' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return w.effect(ctx, tx, d)
	}
	o, err := w.ib.Handle(ctx, w.next(t), handler)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.Equal(t, 3, calls)
	attempts, _ := w.attempts(t, "racy")
	require.Zero(t, attempts)
}

// Issue 17, item 2: attempts of a failing message are spaced by a growing
// delay, and a database that keeps failing (the inbox table is missing)
// is retried with backoff and logged once per interval, not per delivery.
func TestBackoffBetweenAttemptsAndWhileDatabaseFails(t *testing.T) {
	t.Parallel()
	t.Run("attempts", func(t *testing.T) {
		t.Parallel()
		w := setup(t, 4)
		var (
			mu    sync.Mutex
			times []time.Time
		)
		poison := func(context.Context, *sql.Tx, *amqp.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			times = append(times, time.Now())
			return errors.New("poison")
		}
		const delay = 100 * time.Millisecond
		c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: poison, RetryDelay: delay})
		w.publish(t, "poison")
		require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, 30*time.Second, 10*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, times, 4)
		for i := 1; i < len(times); i++ { // jittered between half and all of RetryDelay·2^(i-1)
			require.GreaterOrEqual(t, times[i].Sub(times[i-1]), (delay<<(i-1))/2, "gap %d", i)
		}
	})
	t.Run("database", func(t *testing.T) {
		t.Parallel()
		w := setup(t, 0)
		missing, err := inbox.New(w.db, &inbox.Config{Consumer: "billing", Table: dbtest.Table(t), Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		var log lines
		c := w.run(t, missing, inbox.ConsumerConfig{Handler: w.effect, Logger: log.logger()})
		start := time.Now()
		w.publish(t, "m")
		require.Eventually(t, func() bool { return c.Stats().Requeued >= 4 }, 30*time.Second, 10*time.Millisecond)
		elapsed := time.Since(start)
		// From 100ms, doubling, jittered down to half: 4 waits take at
		// least 50+100+200 ms; without backoff this was thousands a second.
		require.GreaterOrEqual(t, elapsed, 350*time.Millisecond)
		require.LessOrEqual(t, c.Stats().Requeued, int64(12), "backed off")
		require.Zero(t, c.Stats().Retried+c.Stats().DeadLettered, "no attempt counted")
		if elapsed < 10*time.Second {
			require.Equal(t, 1, log.count("Delivery requeued"), "one line per 10s:\n%s", log.String())
		}
		require.Equal(t, log.count("Delivery requeued"), log.count("outbox inbox schema --apply"), "the advice comes with it")
	})
}

// Issue 17, item 3: a message-id that cannot be stored (0xFF, a NUL) is
// dead-lettered once, at once, with a reason; the message behind it is
// handled although the consumer takes one delivery at a time.
func TestUnstorableMessageIDDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	w := setup(t, 0)
	var log lines
	c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: w.effect, Prefetch: 1, Logger: log.logger()})
	w.publish(t, "\xff")
	w.publish(t, "a\x00b")
	w.publish(t, "behind")
	require.Eventually(t, func() bool { return c.Stats().Handled == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 2 }, 10*time.Second, 10*time.Millisecond)
	st := c.Stats()
	require.EqualValues(t, 2, st.Refused, "%+v", st)
	require.Zero(t, st.Requeued+st.Retried, "%+v", st)
	require.EqualValues(t, 1, w.effects(t))
	require.Equal(t, 1, log.count("not valid UTF-8"), log.String())
	require.Equal(t, 1, log.count("NUL byte"))
}

// Issue 17, item 4: a panicking handler is recovered and counted; the
// consumer keeps running and handles the next message.
func TestHandlerPanicCountedConsumerKeepsRunning(t *testing.T) {
	t.Parallel()
	w := setup(t, 2)
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if d.MessageId == "boom" {
			var parts []string
			_ = parts[len(d.Body)] // out of range: panics
		}
		return w.effect(ctx, tx, d)
	}
	var log lines
	c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: handler, RetryDelay: 10 * time.Millisecond, Logger: log.logger()})
	w.publish(t, "boom")
	w.publish(t, "fine")
	require.Eventually(t, func() bool { st := c.Stats(); return st.DeadLettered == 1 && st.Handled == 1 }, 20*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, c.Stats().Retried)
	attempts, dead := w.attempts(t, "boom")
	require.Equal(t, 2, attempts)
	require.True(t, dead)
	var lastError string
	require.NoError(t, w.db.QueryRow(`SELECT last_error FROM "`+w.table+`" WHERE message_id = 'boom'`).Scan(&lastError))
	require.Contains(t, lastError, "the handler panicked: runtime error: index out of range")
	require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
}

// Issue 17, item 4: a handler that rolls the inbox's transaction back
// itself has its attempt counted with an error naming the misuse; one that
// commits it itself is handled (its effect was applied with the record)
// and told.
func TestHandlerEndingTheTransactionIsMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, 0)
	w.publish(t, "rolls-back")
	o, err := w.ib.Handle(ctx, w.next(t), func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if err := w.effect(ctx, tx, d); err != nil {
			return err
		}
		return tx.Rollback()
	})
	require.Equal(t, inbox.Retried, o)
	require.ErrorIs(t, err, inbox.ErrHandlerRolledBack)
	attempts, _ := w.attempts(t, "rolls-back")
	require.Equal(t, 1, attempts)
	require.Zero(t, w.effects(t))

	w = setup(t, 0) // the requeued delivery stays behind in the first world
	w.publish(t, "commits")
	o, err = w.ib.Handle(ctx, w.next(t), func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if err := w.effect(ctx, tx, d); err != nil {
			return err
		}
		return tx.Commit()
	})
	require.Equal(t, inbox.Handled, o)
	require.ErrorIs(t, err, inbox.ErrHandlerCommitted)
	require.EqualValues(t, 1, w.effects(t))
	w.publish(t, "commits")
	o, err = w.ib.Handle(ctx, w.next(t), w.effect)
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, o, "it was recorded with its effect")
}

// Issue 17, item 5: a handler says what kind of error it returns:
// Permanent dead-letters at the first attempt, Transient requeues without
// counting one; anything else counts an attempt.
func TestPermanentAndTransientErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, 5)
	w.publish(t, "bad-json")
	o, err := w.ib.Handle(ctx, w.next(t), func(context.Context, *sql.Tx, *amqp.Delivery) error {
		return inbox.Permanent(errors.New("invalid character '}'"))
	})
	require.Equal(t, inbox.DeadLettered, o)
	require.True(t, inbox.IsPermanent(err))
	attempts, dead := w.attempts(t, "bad-json")
	require.Equal(t, 1, attempts)
	require.True(t, dead)
	require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 10*time.Second, 10*time.Millisecond)

	w.publish(t, "later")
	o, err = w.ib.Handle(ctx, w.next(t), func(context.Context, *sql.Tx, *amqp.Delivery) error {
		return inbox.Transient(errors.New("payment service unavailable"))
	})
	require.Equal(t, inbox.Requeued, o)
	require.True(t, inbox.IsTransient(err))
	require.Zero(t, dbtest.Count(t, w.db, `SELECT count(*) FROM "`+w.table+`" WHERE message_id = 'later'`), "nothing recorded, nothing counted")
	o, err = w.ib.Handle(ctx, w.next(t), w.effect)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.Nil(t, inbox.Permanent(nil))
	require.Nil(t, inbox.Transient(nil))
}

// Issue 17, item 6: a dead-lettered message replayed from the dead-letter
// queue after Retry is applied once; replayed without Retry it is
// dead-lettered again, unapplied.
func TestDeadLetteredReplayedAfterRetryAppliedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, 1)
	var broken atomic.Bool
	broken.Store(true)
	handler := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if broken.Load() {
			return errors.New("the tax service rejects the address")
		}
		return w.effect(ctx, tx, d)
	}
	w.publish(t, "order-7")
	o, _ := w.ib.Handle(ctx, w.next(t), handler)
	require.Equal(t, inbox.DeadLettered, o)
	require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
	dead, err := w.ib.Dead(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "order-7", dead[0].MessageID)
	require.Equal(t, "the tax service rejects the address", dead[0].LastError)
	broken.Store(false) // the fix is deployed

	moved, err := inbox.Replay(ctx, amqptest.Conn(t), w.dlq, "", 10)
	require.NoError(t, err)
	require.Equal(t, 1, moved, "replayed to the queue its x-death names")
	o, err = w.ib.Handle(ctx, w.next(t), handler)
	require.Equal(t, inbox.DeadLettered, o, "the record still says dead")
	require.ErrorContains(t, err, "outbox inbox retry")
	require.Zero(t, w.effects(t))

	// Issue 47, item 12: what a retry would change, counted before it.
	n, err := w.ib.DeadAmong(ctx, "order-7", "no-such-id", "order-7")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = w.ib.Retry(ctx, "order-7", "no-such-id")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = w.ib.DeadAmong(ctx, "order-7")
	require.NoError(t, err)
	require.Zero(t, n, "no longer dead")
	require.Eventually(t, func() bool { return w.queued(t, w.dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
	moved, err = inbox.Replay(ctx, amqptest.Conn(t), w.dlq, w.queue, 10)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	o, err = w.ib.Handle(ctx, w.next(t), handler)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.EqualValues(t, 1, w.effects(t))
	recs, err := w.ib.Records(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.Records{Handled: 1}, recs)
}

// Issue 17, item 7: every outcome has a name, and the consumer counts each.
func TestOutcomesNamed(t *testing.T) {
	t.Parallel()
	for o := inbox.NotHandled; o <= inbox.Requeued; o++ {
		require.NotContains(t, o.String(), "Outcome(", "outcome %d", int(o))
	}
	o, err := (&inbox.Inbox{}).Handle(context.Background(), nil, nil)
	require.Equal(t, inbox.NotHandled, o)
	require.Error(t, err)
}

// Issue 17, item 8: the consumer warns at start when its queue has no
// dead-letter exchange, and not when it has one.
func TestConsumerWarnsWithoutDeadLetterExchange(t *testing.T) {
	t.Parallel()
	w := setup(t, 0) // its queue dead-letters to w.dlq
	var with lines
	c := w.run(t, w.ib, inbox.ConsumerConfig{Handler: w.effect, Logger: with.logger()})
	w.publish(t, "x")
	require.Eventually(t, func() bool { return c.Stats().Handled == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, with.count("no dead-letter exchange"))

	for _, durable := range []bool{true, false} {
		queue := amqptest.Name(t, fmt.Sprint("bare-", durable))
		_, err := w.ch.QueueDeclare(queue, durable, false, false, false, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = w.ch.QueueDelete(queue, false, false, false) })
		var without lines
		c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: queue, Handler: w.effect, URLs: []string{amqptest.URL()}, Logger: without.logger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		require.Eventually(t, func() bool { return without.count("no dead-letter exchange") == 1 }, 10*time.Second, 10*time.Millisecond, "durable %v", durable)
		cancel()
		require.NoError(t, <-done)
		q, err := w.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		require.NoError(t, err, "the probe left the queue alone")
		require.Zero(t, q.Messages)
	}
}

// Issue 17, item 9: configuration that cannot work is refused.
func TestBadConfigurationRefused(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	_, err := inbox.New(db, &inbox.Config{Consumer: "a\x00b"})
	require.ErrorContains(t, err, "NUL")
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	h := func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }
	for cfg, want := range map[*inbox.ConsumerConfig]string{
		{Queue: "q", Handler: h, Prefetch: 70000}:                     "at most 65535",
		{Queue: "q", Handler: h, DialTimeout: -time.Second}:           "must not be negative",
		{Queue: "q", Handler: h, URLs: []string{"http://x:secret@h"}}: "not a valid amqp",
		{Queue: "q", Handler: h, RetryDelay: -1}:                      "must not be negative",
	} {
		_, err := ib.Consumer(cfg)
		require.ErrorContains(t, err, want)
		require.NotContains(t, err.Error(), "secret")
	}
}

// Issue 18, item 1: a consumer with a Topology declares its queue, with a
// dead-letter queue, and its bindings before it consumes; no warning.
func TestConsumerDeclaresTopology(t *testing.T) {
	t.Parallel()
	w := setup(t, 0)
	x, q := amqptest.Name(t, "x"), amqptest.Name(t, "q")
	t.Cleanup(func() {
		_, _ = w.ch.QueueDelete(q, false, false, false)
		_, _ = w.ch.QueueDelete(q+".dead", false, false, false)
		_ = w.ch.ExchangeDelete(x, false, false)
	})
	var log lines
	c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: q, Handler: w.effect, URLs: []string{amqptest.URL()}, Logger: log.logger(),
		Topology: &topology.Topology{
			Exchanges: []topology.Exchange{{Name: x}},
			Queues:    []topology.Queue{{Name: q, Bindings: []topology.Binding{{Exchange: x, Key: "order.#"}}}},
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return log.count("inbox: Consuming") == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, w.ch.PublishWithContext(ctx, x, "order.placed", true, false, amqp.Publishing{MessageId: "t-1", Body: []byte("{}")}))
	require.Eventually(t, func() bool { return c.Stats().Handled == 1 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Zero(t, log.count("no dead-letter exchange"), log.String())
}
