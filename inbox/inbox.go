// Package inbox is the consumer's half of the transactional outbox: it
// turns at-least-once delivery into exactly-once effects.
//
// For each delivery, Handle begins a transaction on the consumer's
// database, records the message id in an inbox table, runs the handler in
// that transaction only if the id is new, commits, and only then acks. A
// message delivered again (the broker redelivers after a lost ack, the
// outbox relay publishes twice after a crash) finds its id recorded and is
// acked without running the handler. A crash between the commit and the ack
// is therefore harmless: the redelivery is a duplicate.
//
//	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing"})
//	for d := range deliveries {
//		outcome, err := ib.Handle(ctx, &d, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET …") // the effect, in the inbox's transaction
//			return err
//		})
//		…
//	}
//
// A handler error rolls the transaction back and the delivery is rejected
// for redelivery; the failed attempts are counted in the database (not
// trusted to the broker's redelivered flag), and after MaxAttempts the
// delivery is dead-lettered (nack without requeue, so that a dead-letter
// exchange gets it) and recorded with its error.
//
// Inbox.Consumer runs the loop around Handle: prefetch, manual acks,
// reconnection after a connection loss, graceful shutdown, purging. This
// package uses database/sql and amqp091-go only; packages inboxgorm and
// inboxent put a GORM session or an ent client in the inbox's transaction.
//
// # Order
//
// With the outbox in ordered mode (outbox.OrderedByKey), a queue with one
// consumer (or RabbitMQ's single active consumer) receives the first
// deliveries of each key in the order the events were written, and since
// effects are applied at a message's first successful handling, they
// follow that order as long as deliveries are handled one after another and
// none is retried. A failed handler requeues its delivery: with
// ConsumerConfig.Prefetch above 1, the deliveries already sent behind it
// are handled before its retry. A consumer that must keep the order through
// failures uses Prefetch 1, so that the broker sends nothing else until
// the failed delivery comes back; a delivery dead-lettered after
// MaxAttempts lets the rest of its key go on.
package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/sqlident"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Migrations holds the schema of the default "inbox" table as plain SQL
// files for golang-migrate and Atlas (NNN_name.up.sql / .down.sql) and,
// under goose/, for goose; `outbox inbox schema --table NAME` prints the
// DDL for another name.
//
//go:embed migrations
var Migrations embed.FS

// Defaults of Config.
const (
	TableDefault       = "inbox"
	MaxAttemptsDefault = 5
	lastErrorMax       = 2000
)

var (
	// ErrNoMessageID is returned for a delivery without a message-id: it
	// cannot be deduplicated, so it is refused (nack without requeue)
	// rather than risk handling it twice.
	ErrNoMessageID = errors.New("inbox: the delivery has no message-id, so it cannot be deduplicated; it was refused (dead-lettered)")

	// ErrInvalidTable is returned for a table name that is not a plain,
	// optionally schema-qualified, lowercase identifier.
	ErrInvalidTable = errors.New("inbox: invalid table name")
)

// Config configures an Inbox.
type Config struct {
	// Consumer names the consumer; several consumers may share one table,
	// each deduplicating on its own. Required.
	Consumer string

	// Table is the inbox table, optionally schema-qualified. Defaults to
	// "inbox".
	Table string

	// MaxAttempts is how many failed deliveries of a message dead-letter
	// it. Defaults to 5.
	MaxAttempts int

	// Logger receives dead-lettering and refusals. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Inbox records the messages a consumer has handled.
type Inbox struct {
	db          *sql.DB
	table       string // quoted
	name        string
	consumer    string
	maxAttempts int
	logger      *slog.Logger
	q           struct{ claim, retry, failed, purge, purgeable string }
	afterCommit func(*amqp.Delivery) // tests: runs between commit and ack
}

// Handler applies a message's effect through tx, the inbox's transaction:
// it commits only together with the record that the message was handled.
type Handler func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error

// Outcome says what Handle did with a delivery.
type Outcome int

// Outcomes of Handle.
const (
	Handled      Outcome = iota + 1 // the handler ran and committed; acked
	Duplicate                       // handled before; acked without running the handler
	Retried                         // the handler failed; rejected for redelivery
	DeadLettered                    // failed MaxAttempts times (or dead before); nacked without requeue
	Refused                         // no message-id; nacked without requeue
)

func (o Outcome) String() string {
	switch o {
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
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// parseTable validates a table name (see package sqlident); "" is the
// default.
func parseTable(name string) (sqlident.Table, error) {
	t, err := sqlident.ParseTable(cmp.Or(name, TableDefault))
	if err != nil {
		return t, fmt.Errorf("%w %v", ErrInvalidTable, err)
	}
	return t, nil
}

// New returns an Inbox on db, the consumer's database. It does not touch
// the database.
func New(db *sql.DB, cfg *Config) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox: New: db is nil")
	}
	if cfg == nil || cfg.Consumer == "" {
		return nil, errors.New("inbox: Config.Consumer is required: it names the consumer whose handled messages the table records")
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("inbox: Config.MaxAttempts must not be negative (got %d)", cfg.MaxAttempts)
	}
	name := cmp.Or(cfg.Table, TableDefault)
	t, err := parseTable(name)
	if err != nil {
		return nil, err
	}
	quoted := t.Quoted
	ib := &Inbox{db: db, table: quoted, name: name, consumer: cfg.Consumer,
		maxAttempts: cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault), logger: cmp.Or(cfg.Logger, slog.Default())}
	r := strings.NewReplacer("{table}", quoted)
	// One statement takes the message's row and locks it for the
	// transaction: a concurrent delivery of the same id waits here until
	// this one commits or rolls back. A new row is inserted already marked
	// handled (xmax = 0 tells an inserted row from an updated one): the
	// mark commits only with the handler's effect, and a handler error
	// rolls both back. An existing row is returned as it is.
	ib.q.claim = r.Replace(`INSERT INTO {table} (consumer, message_id, handled_at) VALUES ($1, $2, now())
ON CONFLICT (consumer, message_id) DO UPDATE SET consumer = EXCLUDED.consumer
RETURNING xmax = 0, handled_at IS NOT NULL, dead_at IS NOT NULL`)
	ib.q.retry = r.Replace(`UPDATE {table} SET handled_at = now() WHERE consumer = $1 AND message_id = $2`)
	// Failures are counted outside the rolled back transaction; the
	// attempt that reaches MaxAttempts dead-letters the message in the
	// same statement.
	ib.q.failed = r.Replace(`INSERT INTO {table} AS i (consumer, message_id, attempts, last_error, dead_at)
VALUES ($1, $2, 1, $3, CASE WHEN 1 >= $4 THEN now() END)
ON CONFLICT (consumer, message_id) DO UPDATE
SET attempts = i.attempts + 1, last_error = $3, dead_at = CASE WHEN i.attempts + 1 >= $4 THEN now() END
RETURNING attempts, dead_at IS NOT NULL`)
	ib.q.purgeable = r.Replace(`SELECT count(*) FROM {table}
WHERE consumer = $1 AND received_at < now() - $2::bigint * interval '1 microsecond'
  AND (handled_at IS NOT NULL OR dead_at IS NOT NULL)`)
	ib.q.purge = r.Replace(`DELETE FROM {table} WHERE (consumer, message_id) IN (
	SELECT consumer, message_id FROM {table}
	WHERE consumer = $1 AND received_at < now() - $2::bigint * interval '1 microsecond'
	  AND (handled_at IS NOT NULL OR dead_at IS NOT NULL)
	ORDER BY received_at
	LIMIT $3)`)
	return ib, nil
}

// Table returns the inbox table's name, as configured.
func (ib *Inbox) Table() string { return ib.name }

// Purgeable counts the records Purge(ctx, olderThan) would delete now.
func (ib *Inbox) Purgeable(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Purgeable: age must not be negative (got %s)", olderThan)
	}
	var n int64
	if err := ib.db.QueryRowContext(ctx, ib.q.purgeable, ib.consumer, olderThan.Microseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: counting purgeable records in %s: %w", ib.name, err)
	}
	return n, nil
}

// DropSchema returns the DDL that drops an inbox table: the down
// migration.
func DropSchema(table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return "DROP TABLE IF EXISTS " + t.Quoted + ";\n", nil
}

// Schema returns the DDL of an inbox table of the given name.
func Schema(table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return strings.NewReplacer("{table}", t.Quoted, "{name}", t.Name).Replace(`CREATE TABLE IF NOT EXISTS {table} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    handled_at  timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    dead_at     timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS "{name}_received_idx" ON {table} (received_at);
`), nil
}

// CreateSchemaIfAbsent creates the inbox table if it does not exist. It is
// meant for development and tests; in production the table belongs to
// your migrations (Schema).
func (ib *Inbox) CreateSchemaIfAbsent(ctx context.Context) error {
	ddl, err := Schema(ib.name)
	if err != nil {
		return err
	}
	tx, err := ib.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inbox: creating %s: %w", ib.name, err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "inbox:"+ib.table); err != nil {
		return fmt.Errorf("inbox: creating %s: %w", ib.name, err)
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("inbox: creating %s: %w", ib.name, err)
	}
	return tx.Commit()
}

// Handle handles one delivery exactly once, as the package doc says, and
// acks or rejects it. It returns what it did; the error is the handler's
// (Retried, DeadLettered), ErrNoMessageID (Refused), or a failure of the
// database or the broker, after which the delivery was rejected for
// redelivery when that was still possible.
func (ib *Inbox) Handle(ctx context.Context, d *amqp.Delivery, h Handler) (Outcome, error) {
	if d == nil || h == nil {
		return 0, errors.New("inbox: Handle: the delivery and the handler must not be nil")
	}
	if d.MessageId == "" {
		ib.logger.ErrorContext(ctx, "inbox: Delivery without a message-id refused", slog.String("consumer", ib.consumer),
			slog.String("routing_key", d.RoutingKey), slog.String("type", d.Type))
		return Refused, errors.Join(ErrNoMessageID, d.Nack(false, false))
	}
	tx, err := ib.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, ib.requeue(d, fmt.Errorf("inbox: beginning a transaction: %w", err))
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	var inserted, handled, dead bool
	if err := tx.QueryRowContext(ctx, ib.q.claim, ib.consumer, d.MessageId).Scan(&inserted, &handled, &dead); err != nil {
		return 0, ib.requeue(d, fmt.Errorf("inbox: recording message %s in %s: %w", d.MessageId, ib.name, err))
	}
	switch {
	case inserted: // new: go on
	case handled:
		_ = tx.Rollback() // nothing to keep
		return Duplicate, d.Ack(false)
	case dead:
		_ = tx.Rollback()
		return DeadLettered, d.Nack(false, false)
	default: // earlier deliveries failed: try again, marked with this one
		if _, err := tx.ExecContext(ctx, ib.q.retry, ib.consumer, d.MessageId); err != nil {
			return 0, ib.requeue(d, fmt.Errorf("inbox: recording message %s in %s: %w", d.MessageId, ib.name, err))
		}
	}

	if herr := h(ctx, tx, d); herr != nil {
		_ = tx.Rollback()
		return ib.failed(ctx, d, herr)
	}
	if err := tx.Commit(); err != nil {
		return 0, ib.requeue(d, fmt.Errorf("inbox: committing message %s: %w", d.MessageId, err))
	}
	// Committed: from here a redelivery is a duplicate, so a lost ack
	// costs nothing but a second look.
	if ib.afterCommit != nil { // tests: a crash right here
		ib.afterCommit(d)
	}
	return Handled, d.Ack(false)
}

// failed counts a failed attempt and rejects the delivery for redelivery,
// or dead-letters it at MaxAttempts.
func (ib *Inbox) failed(ctx context.Context, d *amqp.Delivery, herr error) (Outcome, error) {
	reason := herr.Error()
	if len(reason) > lastErrorMax {
		reason = strings.ToValidUTF8(reason[:lastErrorMax], "") + "…"
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var (
		attempts int
		dead     bool
	)
	if err := ib.db.QueryRowContext(cctx, ib.q.failed, ib.consumer, d.MessageId, reason, ib.maxAttempts).Scan(&attempts, &dead); err != nil {
		return Retried, ib.requeue(d, errors.Join(herr, fmt.Errorf("inbox: counting the failed attempt: %w", err)))
	}
	if !dead {
		return Retried, errors.Join(herr, d.Nack(false, true))
	}
	ib.logger.WarnContext(ctx, "inbox: Message dead-lettered after too many failed attempts", slog.String("consumer", ib.consumer),
		slog.String("message_id", d.MessageId), slog.Int("attempts", attempts), slog.String("error", reason))
	return DeadLettered, errors.Join(herr, d.Nack(false, false))
}

// requeue rejects the delivery for redelivery after a failure of the
// database, and returns err with the broker's error, if any.
func (ib *Inbox) requeue(d *amqp.Delivery, err error) error {
	return errors.Join(err, d.Nack(false, true))
}

// PurgeBatchSize is how many rows one statement of Purge deletes.
const PurgeBatchSize = 5000

// Purge deletes the consumer's records of messages handled or dead-lettered
// more than olderThan ago, in batches of PurgeBatchSize, and returns how
// many it deleted. A message redelivered after its record is purged would
// be handled again: keep records longer than the broker may redeliver and
// the outbox relay may publish twice (its lease, plus the longest outage
// you ride out). Records of messages still failing are kept.
func (ib *Inbox) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Purge: age must not be negative (got %s)", olderThan)
	}
	var total int64
	for {
		res, err := ib.db.ExecContext(ctx, ib.q.purge, ib.consumer, olderThan.Microseconds(), PurgeBatchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: purging %s: %w", ib.name, err)
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil || n < PurgeBatchSize {
			return total, err
		}
	}
}
