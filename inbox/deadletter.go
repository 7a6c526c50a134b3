package inbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// dlxProbe is the dead-letter exchange the probe declares: a name no queue
// has, so that RabbitMQ always answers with the queue's own value.
const dlxProbe = "acemq-inbox-probe-no-such-exchange"

// checkDeadLettering warns when the consumer's queue has no dead-letter
// exchange among its arguments: what the inbox dead-letters would be
// dropped by the broker. AMQP has no call that returns a queue's
// arguments; a declare with a different x-dead-letter-exchange is refused
// (PRECONDITION_FAILED) with a reason that quotes the queue's own value,
// or says it has none, and changes nothing. A dead-letter exchange set by
// a policy is not seen: the warning says so.
func (c *Consumer) checkDeadLettering(ctx context.Context, conn *amqp.Connection) {
	has, known := probeDeadLettering(conn, c.cfg.Queue)
	switch {
	case !known:
		c.log.DebugContext(ctx, "inbox: Could not tell whether the queue has a dead-letter exchange", slog.String("queue", c.cfg.Queue))
	case !has:
		c.log.WarnContext(ctx, "inbox: The queue has no dead-letter exchange: the broker drops what the inbox dead-letters "+
			"(unless a policy sets dead-letter-exchange). Declare it with x-dead-letter-exchange, e.g. with `outbox declare`",
			slog.String("queue", c.cfg.Queue))
	}
}

// probeDeadLettering reports whether queue has an x-dead-letter-exchange
// argument, and whether it could tell.
func probeDeadLettering(conn *amqp.Connection, queue string) (has, known bool) {
	durable, autoDelete := true, false
	for range 4 {
		ch, err := conn.Channel()
		if err != nil {
			return false, false
		}
		_, err = ch.QueueDeclare(queue, durable, autoDelete, false, false, amqp.Table{"x-dead-letter-exchange": dlxProbe})
		if err == nil { // the queue was gone and the probe made it: undo that
			_, _ = ch.QueueDelete(queue, false, true, false)
			_ = ch.Close()
			return false, false
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return false, false
		}
		switch reason := ae.Reason; {
		case strings.Contains(reason, "'x-dead-letter-exchange'"):
			return !strings.HasSuffix(reason, "current is none"), true
		case strings.Contains(reason, "'durable'"):
			durable = !durable
		case strings.Contains(reason, "'auto_delete'"):
			autoDelete = !autoDelete
		default:
			return false, false
		}
	}
	return false, false
}
