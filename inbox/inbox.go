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
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/internal/dbpool"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/pgschema"
	"github.com/acemq/outbox/internal/sqlident"
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
	mysql       bool // the database is MySQL or MariaDB (mysql.go)
	q           struct{ claim, claimRead, retry, failed, failedRead, handled, purge, purgeable, revive, reviveAll, dead, deadAmong, records string }
	afterCommit func(*amqp.Delivery) // tests: runs between commit and ack
	readOnly    dbpool.Leaver        // drops the pool's connections to a server that accepts no writes
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
	if !utf8.ValidString(cfg.Consumer) || strings.IndexByte(cfg.Consumer, 0) >= 0 {
		return nil, fmt.Errorf("inbox: Config.Consumer %q must be valid UTF-8 without NUL bytes: it is stored in the inbox table", cfg.Consumer)
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("inbox: Config.MaxAttempts must not be negative (got %d)", cfg.MaxAttempts)
	}
	name := cmp.Or(cfg.Table, TableDefault)
	t, err := parseTable(name)
	if err != nil {
		return nil, err
	}
	spoken, err := dialect.Check("inbox: New", "the *sql.DB's driver speaks", dialect.OfDriver(db.Driver()))
	if err != nil {
		return nil, err
	}
	quoted := t.Quoted
	ib := &Inbox{db: db, table: quoted, name: name, consumer: cfg.Consumer, mysql: spoken == dialect.MySQL,
		maxAttempts: cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault), logger: cmp.Or(cfg.Logger, slog.Default())}
	if ib.mysql {
		if len([]rune(cfg.Consumer)) > 255 {
			return nil, fmt.Errorf("inbox: Config.Consumer is %d characters long: on MySQL and MariaDB a consumer's name is at most 255", len([]rune(cfg.Consumer)))
		}
		ib.table = mysqlQuoted(quoted)
		ib.mysqlQueries(ib.table)
		return ib, nil
	}
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
	ib.q.handled = r.Replace(`SELECT handled_at IS NOT NULL FROM {table} WHERE consumer = $1 AND message_id = $2`)
	ib.q.revive = r.Replace(`UPDATE {table} SET dead_at = NULL, attempts = 0 WHERE consumer = $1 AND message_id = $2 AND dead_at IS NOT NULL`)
	ib.q.reviveAll = r.Replace(`UPDATE {table} SET dead_at = NULL, attempts = 0 WHERE consumer = $1 AND dead_at IS NOT NULL`)
	ib.q.dead = r.Replace(`SELECT message_id, attempts, coalesce(last_error, ''),
	(extract(epoch FROM received_at) * 1000000)::bigint, (extract(epoch FROM dead_at) * 1000000)::bigint FROM {table}
WHERE consumer = $1 AND dead_at IS NOT NULL
  AND ($3::bigint = 0 OR (dead_at, message_id) > (to_timestamp(0) + $3::bigint * interval '1 microsecond', $4::text))
ORDER BY dead_at, message_id LIMIT $2`)
	ib.q.deadAmong = r.Replace(`SELECT count(*) FROM {table} WHERE consumer = $1 AND message_id = ANY($2::text[]) AND dead_at IS NOT NULL`)
	ib.q.records = r.Replace(`SELECT count(*) FILTER (WHERE handled_at IS NOT NULL), count(*) FILTER (WHERE handled_at IS NULL AND dead_at IS NULL),
	count(*) FILTER (WHERE dead_at IS NOT NULL) FROM {table} WHERE consumer = $1`)
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

// ConsumerName is the consumer whose records this Inbox keeps
// (Config.Consumer).
func (ib *Inbox) ConsumerName() string { return ib.consumer }

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
	if ib.mysql {
		ddl, err := MySQLSchema(ib.name)
		if err == nil {
			_, err = ib.db.ExecContext(ctx, strings.TrimSuffix(strings.TrimSpace(ddl), ";"))
		}
		if err != nil {
			return fmt.Errorf("inbox: creating %s: %w", ib.name, err)
		}
		return nil
	}
	ddl, err := Schema(ib.name)
	if err != nil {
		return err
	}
	if err := pgschema.Apply(ctx, ib.db, "inbox:"+ib.table, ddl); err != nil {
		return fmt.Errorf("inbox: creating %s: %w", ib.name, err)
	}
	return nil
}
