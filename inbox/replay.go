package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Replay moves up to limit messages from the queue from (a dead-letter
// queue) back to a queue: to, when given, else the queue each message was
// dead-lettered from (its x-death header). Each copy is published through
// the default exchange, mandatory and with publisher confirms, with the
// message's id, headers and body; the original is acked in from only once
// the broker confirmed the copy, so a failure leaves it where it was. It
// returns how many it moved.
//
// An inbox that dead-lettered a message handles a replayed copy only once
// its record was made eligible again (Inbox.Retry, `outbox inbox retry`):
// retry first, then replay.
func Replay(ctx context.Context, conn *amqp.Connection, from, to string, limit int) (int, error) {
	if conn == nil || from == "" || limit <= 0 {
		return 0, errors.New("inbox: Replay needs a connection, a queue to replay from and a positive limit")
	}
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("inbox: replaying from %s: %w", from, err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, fmt.Errorf("inbox: replaying from %s: enabling publisher confirms: %w", from, err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	moved := 0
	for moved < limit {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		d, ok, err := ch.Get(from, false)
		if err != nil {
			return moved, fmt.Errorf("inbox: replaying from %s: %w", from, err)
		}
		if !ok {
			return moved, nil
		}
		target := cmp.Or(to, deadLetteredFrom(d.Headers))
		if target == "" {
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("inbox: replaying from %s: message %q has no x-death header naming its queue; give the queue to replay to", from, d.MessageId)
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", target, true, false, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
			DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
		})
		if err != nil {
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("inbox: replaying message %q to %s: %w", d.MessageId, target, err)
		}
		acked, err := conf.WaitContext(ctx)
		select {
		case r := <-returns:
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("inbox: replaying message %q: queue %s does not exist (%s)", d.MessageId, target, r.ReplyText)
		default:
		}
		if err != nil || !acked {
			_ = d.Nack(false, true)
			return moved, fmt.Errorf("inbox: replaying message %q to %s: the broker did not confirm it (%v)", d.MessageId, target, err)
		}
		if err := d.Ack(false); err != nil {
			return moved, fmt.Errorf("inbox: replaying message %q: it was copied to %s, but acking the original failed, so it stays in %s too: %w", d.MessageId, target, from, err)
		}
		moved++
	}
	return moved, nil
}

// deadLetteredFrom returns the queue named by the newest x-death entry.
func deadLetteredFrom(h amqp.Table) string {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return ""
	}
	t, _ := deaths[0].(amqp.Table)
	q, _ := t["queue"].(string)
	return q
}
