package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkInboxVsPlain consumes the same persistent messages from a
// durable queue twice in one run: with a plain consumer that writes the
// effect in a transaction and acks, and through Inbox.Handle, which also
// records and checks the message id. It reports both rates and the inbox's
// cost per message relative to the plain consumer's (issue 12's target:
// at most 1.3).
func BenchmarkInboxVsPlain(b *testing.B) {
	n := dbtest.EnvInt(b, "OUTBOX_BENCH_MESSAGES", 2000)
	ctx := context.Background()
	db := dbtest.DB(b)
	table := dbtest.Table(b)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "bench", Table: table})
	if err != nil {
		b.Fatal(err)
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE "` + table + `_effects" (message_id text NOT NULL, body bytea)`); err != nil {
		b.Fatal(err)
	}
	conn := amqptest.Conn(b)
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	queue := amqptest.Name(b, "q")
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`_effects" VALUES ($1, $2)`, d.MessageId, d.Body)
		return err
	}
	body := make([]byte, 256)
	run := func(round int, handle func(d *amqp.Delivery) error) float64 {
		for i := range n {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("r%d-%d", round, i), Body: body}); err != nil {
				b.Fatal(err)
			}
		}
		cch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer cch.Close()
		if err := cch.Qos(50, 0, false); err != nil {
			b.Fatal(err)
		}
		deliveries, err := cch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for range n {
			d := <-deliveries
			if err := handle(&d); err != nil {
				b.Fatal(err)
			}
		}
		return float64(n) / time.Since(start).Seconds()
	}
	plain := func(d *amqp.Delivery) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck
		if err := effect(ctx, tx, d); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		return d.Ack(false)
	}
	withInbox := func(d *amqp.Delivery) error {
		_, err := ib.Handle(ctx, d, effect)
		return err
	}
	var plainRate, inboxRate float64
	b.ResetTimer()
	for i := range b.N {
		plainRate += run(2*i, plain)
		inboxRate += run(2*i+1, withInbox)
	}
	b.ReportMetric(plainRate/float64(b.N), "plain-msgs/s")
	b.ReportMetric(inboxRate/float64(b.N), "inbox-msgs/s")
	b.ReportMetric(plainRate/inboxRate, "inbox-cost-ratio")
}
