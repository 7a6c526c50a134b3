package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// TestHelperConsumerProcess is the consumer process that
// TestConsumerKilledBetweenCommitAndAck kills: it consumes through the
// inbox and SIGKILLs itself right after committing the effect of the
// message named by OUTBOX_KILL_AT, before the ack.
func TestHelperConsumerProcess(t *testing.T) {
	if os.Getenv("OUTBOX_INBOX_HELPER") != "1" {
		t.Skip("run by TestConsumerKilledBetweenCommitAndAck")
	}
	table, queue, killAt := os.Getenv("OUTBOX_TABLE"), os.Getenv("OUTBOX_QUEUE"), os.Getenv("OUTBOX_KILL_AT")
	driver, dsn := "pgx", dbtest.URL()
	if d := os.Getenv("OUTBOX_MYSQL_DSN"); d != "" {
		driver, dsn = "mysql", d
	}
	db, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	w := &world{mysql: driver == "mysql", table: table}
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: table})
	require.NoError(t, err)
	inbox.SetAfterCommit(ib, func(d *amqp.Delivery) {
		if d.MessageId == killAt {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal takes the process
		}
	})
	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, w.sql(`INSERT INTO "`+table+`_effects" VALUES ($1)`), d.MessageId)
		return err
	}
	c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: queue, Handler: effect, URLs: []string{amqptest.URL()}, Prefetch: 10})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = c.Run(ctx)
}

// Issue 12: the consumer process is SIGKILLed between the commit of a
// message's effect and its ack. The broker redelivers it (and what was
// prefetched); a new consumer finds it handled: every effect exactly once.
func TestConsumerKilledBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	const n = 50
	databases(t, 0, func(t *testing.T, w *world) {
		require.NoError(t, w.ch.Cancel(testConsumerTag, false))
		for i := range n {
			w.publish(t, fmt.Sprint("m-", i))
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperConsumerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "OUTBOX_INBOX_HELPER=1", "OUTBOX_TABLE="+w.table, "OUTBOX_QUEUE="+w.queue, "OUTBOX_KILL_AT=m-20", "OUTBOX_MYSQL_DSN="+w.dsn)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "the helper must die: %v\n%s", err, out)
		require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "killed, not exited: %s", out)
		require.EqualValues(t, 1, dbtest.Count(t, w.db, w.sql(`SELECT count(*) FROM "`+w.table+`_effects" WHERE message_id = 'm-20'`)),
			"m-20's effect was committed before the kill")
		require.Eventually(t, func() bool { return w.queued(t, w.queue) >= n-20 }, 10*time.Second, 20*time.Millisecond,
			"m-20 and the rest are back in the queue")

		c, err := w.ib.Consumer(&inbox.ConsumerConfig{Queue: w.queue, Handler: w.effect, URLs: []string{amqptest.URL()}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		require.Eventually(t, func() bool { return w.effects(t) == n && w.queued(t, w.queue) == 0 }, 30*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool { return c.Stats().Duplicates >= 1 }, 10*time.Second, 20*time.Millisecond, "m-20 came back as a duplicate")
		cancel()
		require.NoError(t, <-done)
		require.EqualValues(t, n, dbtest.Count(t, w.db, w.sql(`SELECT count(DISTINCT message_id) FROM "`+w.table+`_effects"`)))
		require.EqualValues(t, n, w.effects(t), "nothing applied twice")
	})
}
