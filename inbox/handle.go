package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/internal/textcut"
)

// Handler applies a message's effect through tx, the inbox's transaction:
// it commits only together with the record that the message was handled.
// A handler neither commits nor rolls back tx: it returns nil, or an
// error (see Permanent and Transient for the two kinds it can name).
type Handler func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error

// Outcome says what Handle did with a delivery.
type Outcome int

// Outcomes of Handle. Each is counted in ConsumerStats and reported to the
// Observer (and so in outboxotel's metrics) under its String.
const (
	// NotHandled: Handle was called with a nil delivery or handler;
	// nothing was done and nothing settled.
	NotHandled Outcome = iota
	// Handled: the handler ran and its effect committed with the record;
	// acked.
	Handled
	// Duplicate: the message was handled before; acked without running
	// the handler.
	Duplicate
	// Retried: the handler failed (an error it returned, or a panic); the
	// attempt was counted and the delivery requeued.
	Retried
	// DeadLettered: the handler failed for the MaxAttempts-th time or
	// returned a Permanent error, or the message's record says it was
	// dead-lettered before; nacked without requeue, so that the queue's
	// dead-letter exchange gets it.
	DeadLettered
	// Refused: the delivery's message-id is missing or cannot be recorded
	// (ErrNoMessageID, ErrInvalidMessageID); nacked without requeue at
	// once, as no redelivery can change it.
	Refused
	// Requeued: not handled for a reason outside the message (the
	// database failed to begin, record, commit or count; the session was
	// lost; a serialization failure or deadlock persisted; the handler
	// returned a Transient error; ctx ended). No attempt was counted; the
	// delivery was requeued. A Consumer backs off before it goes on.
	Requeued
)

func (o Outcome) String() string {
	switch o {
	case NotHandled:
		return "not-handled"
	case Handled:
		return "handled"
	case Duplicate:
		return "duplicate"
	case Retried:
		return "retried"
	case DeadLettered:
		return "dead-lettered"
	case Refused:
		return "refused"
	case Requeued:
		return "requeued"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// serializationTries is how often a transaction that lost a serialization
// race or a deadlock is run, at once, before its delivery is requeued.
const serializationTries = 3

// result is what handle decided; the caller settles the delivery.
type result struct {
	outcome  Outcome
	err      error
	attempts int // failed attempts counted so far, with Retried
}

// Handle handles one delivery exactly once, as the package doc says, and
// acks or rejects it at once. It returns what it did (see Outcome) and the
// error behind anything but Handled and Duplicate, joined with the
// broker's error when settling failed. Handle never waits: a caller that
// gets Requeued or Retried backs off before the next delivery, as
// Consumer does.
func (ib *Inbox) Handle(ctx context.Context, d *amqp.Delivery, h Handler) (Outcome, error) {
	if d == nil || h == nil {
		return NotHandled, errors.New("inbox: Handle: the delivery and the handler must not be nil")
	}
	r := ib.handle(ctx, d, h, ib.logger)
	return r.outcome, errors.Join(r.err, settle(d, r.outcome))
}

// settle acks, requeues or rejects d as outcome says.
func settle(d *amqp.Delivery, o Outcome) error {
	switch o {
	case Handled, Duplicate:
		return d.Ack(false)
	case Retried, Requeued:
		return d.Nack(false, true)
	default:
		return d.Nack(false, false)
	}
}

// handle decides a delivery's outcome and does its database work, without
// settling it.
// It logs to lg.
func (ib *Inbox) handle(ctx context.Context, d *amqp.Delivery, h Handler, lg *slog.Logger) result {
	if err := checkMessageID(d.MessageId); err != nil {
		return ib.refuse(ctx, d, err, lg)
	}
	for try := 1; ; try++ {
		r, again := ib.attempt(ctx, d, h, lg)
		if r.outcome == Requeued {
			// An old primary, fenced by a failover, keeps its sessions:
			// close the pool's connections to it, so that it connects
			// again (see package dbpool).
			if n := ib.readOnly.After(ctx, ib.db, ib.mysql, r.err); n > 0 {
				lg.WarnContext(ctx, "inbox: Closed connections to a server that accepts no writes, to connect again", slog.Int("num_closed", n))
			}
		}
		if !again || try == serializationTries || ctx.Err() != nil {
			return r
		}
	}
}

// attempt runs one transaction; again reports a serialization failure or
// a deadlock, worth running it again at once.
func (ib *Inbox) attempt(ctx context.Context, d *amqp.Delivery, h Handler, lg *slog.Logger) (r result, again bool) {
	requeue := func(err error) (result, bool) {
		return result{outcome: Requeued, err: err}, retryAtOnce(err)
	}
	tx, err := ib.db.BeginTx(ctx, nil)
	if err != nil {
		return requeue(fmt.Errorf("inbox: beginning a transaction: %w", err))
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	inserted, handled, dead, err := ib.record(ctx, tx, d.MessageId)
	if err != nil {
		if messageFault(err) {
			return ib.refuse(ctx, d, fmt.Errorf("%w: %w", ErrInvalidMessageID, err), lg), false
		}
		return requeue(fmt.Errorf("inbox: recording message %q in %s: %w", d.MessageId, ib.name, err))
	}
	switch {
	case inserted: // new: go on
	case handled:
		return result{outcome: Duplicate}, false
	case dead:
		return result{outcome: DeadLettered, err: fmt.Errorf("inbox: message %q was dead-lettered before; `outbox inbox retry` (Inbox.Retry) makes it eligible again", d.MessageId)}, false
	default: // earlier deliveries failed: try again, marked with this one
		if _, err := tx.ExecContext(ctx, ib.q.retry, ib.consumer, d.MessageId); err != nil {
			return requeue(fmt.Errorf("inbox: recording message %q in %s: %w", d.MessageId, ib.name, err))
		}
	}

	herr := run(ctx, tx, d, h)
	if herr == nil {
		if err := tx.Commit(); err != nil {
			if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
				return ib.endedByHandler(ctx, d, nil, lg), false
			}
			return requeue(fmt.Errorf("inbox: committing message %q: %w", d.MessageId, err))
		}
		// Committed: from here a redelivery is a duplicate, so a lost ack
		// costs nothing but a second look.
		if ib.afterCommit != nil { // tests: a crash right here
			ib.afterCommit(d)
		}
		return result{outcome: Handled}, false
	}
	rerr := tx.Rollback()
	var pe *PanicError
	switch {
	case ctx.Err() != nil:
		return result{outcome: Requeued, err: herr}, false
	case errors.Is(rerr, sql.ErrTxDone):
		return ib.endedByHandler(ctx, d, herr, lg), false
	case IsTransient(herr):
		return result{outcome: Requeued, err: herr}, false
	case IsPermanent(herr):
		return ib.failed(ctx, d, herr, true, lg), false
	case errors.As(herr, &pe):
		lg.ErrorContext(ctx, "inbox: Handler panicked", slog.String("consumer", ib.consumer),
			slog.String("message_id", d.MessageId), slog.Any("panic", pe.Value), slog.String("stack", string(pe.Stack)))
		return ib.failed(ctx, d, herr, false, lg), false
	case infrastructure(herr) || rerr != nil:
		// The database failed under the handler (a terminated session, a
		// lost connection, a serialization failure): not the message's
		// fault, no attempt counted.
		return requeue(errors.Join(herr, rerr))
	}
	return ib.failed(ctx, d, herr, false, lg), false
}

// run calls the handler, turning a panic into a *PanicError.
func run(ctx context.Context, tx *sql.Tx, d *amqp.Delivery, h Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, tx, d)
}

// endedByHandler finds out what a handler that ended the inbox's
// transaction itself did: committed (the message is handled, the misuse
// reported) or rolled back (a failed attempt).
func (ib *Inbox) endedByHandler(ctx context.Context, d *amqp.Delivery, herr error, lg *slog.Logger) result {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var handled bool
	err := ib.db.QueryRowContext(cctx, ib.q.handled, ib.consumer, d.MessageId).Scan(&handled)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return result{outcome: Requeued, err: errors.Join(herr, fmt.Errorf("inbox: the handler ended the transaction itself, and reading what it did failed: %w", err))}
	case handled:
		return result{outcome: Handled, err: errors.Join(ErrHandlerCommitted, herr)}
	}
	return ib.failed(ctx, d, errors.Join(ErrHandlerRolledBack, herr), false, lg)
}

// failed counts a failed attempt, dead-lettering the message at
// MaxAttempts or at once when now is set. When the count cannot be
// written the delivery is requeued without it.
func (ib *Inbox) failed(ctx context.Context, d *amqp.Delivery, herr error, now bool, lg *slog.Logger) result {
	reason := storable(herr.Error())
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	limit := ib.maxAttempts
	if now {
		limit = 1
	}
	attempts, dead, err := ib.countFailure(cctx, d.MessageId, reason, limit)
	if err != nil {
		return result{outcome: Requeued, err: errors.Join(herr, fmt.Errorf("inbox: counting the failed attempt: %w", err))}
	}
	if !dead {
		return result{outcome: Retried, err: herr, attempts: attempts}
	}
	why := "after too many failed attempts"
	if now {
		why = "at once: the handler called its error permanent"
	}
	lg.WarnContext(ctx, "inbox: Message dead-lettered "+why, slog.String("consumer", ib.consumer),
		slog.String("message_id", d.MessageId), slog.Int("attempts", attempts), slog.String("error", reason))
	return result{outcome: DeadLettered, err: herr, attempts: attempts}
}

// refuse dead-letters a delivery whose message-id cannot be recorded.
func (ib *Inbox) refuse(ctx context.Context, d *amqp.Delivery, err error, lg *slog.Logger) result {
	lg.ErrorContext(ctx, "inbox: Delivery refused: its message-id cannot be recorded", slog.String("consumer", ib.consumer),
		slog.String("message_id", storable(d.MessageId)), slog.String("routing_key", d.RoutingKey), slog.String("type", d.Type),
		slog.String("reason", err.Error()))
	return result{outcome: Refused, err: err}
}

// storable returns s fit for a text column and a log line: valid UTF-8,
// without NUL bytes, at most lastErrorMax bytes.
func storable(s string) string {
	return textcut.Cut(strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\\x00"), lastErrorMax)
}
