package outbox

import (
	"embed"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/acemq/outbox/internal/sqlident"
	"github.com/acemq/outbox/internal/textcut"
)

// TableDefault is the outbox table used when no name is configured.
const TableDefault = "outbox"

// Migrations holds the schema of the default "outbox" table as plain SQL
// files, in the layout golang-migrate and Atlas read
// (NNN_name.up.sql / NNN_name.down.sql) and, under goose/, in goose's
// annotated form: at the top, the default layout (LayoutLog, what Schema
// creates); under rows/ (and rows/goose/), the rows layout, what
// RowsSchema creates. Copy them into the migrations of your application,
// or print the DDL for another table name with Schema or `outbox schema`.
//
//go:embed migrations
var Migrations embed.FS

// table is a validated table name, kept in its quoted and its plain form.
type table struct {
	quoted string // "schema"."name" or "name", safe to splice into SQL
	name   string // the unqualified name, for index names
	full   string // as given
}

// parseTable validates a table name (see package sqlident): nothing but a
// plain, optionally schema-qualified, lowercase identifier is accepted, so
// that a name can never change the meaning of the SQL it is placed in.
func parseTable(s string) (table, error) {
	if s == "" {
		return table{}, fmt.Errorf("%w name: the name is empty; leave StoreConfig.Table unset for %q", ErrInvalidTable, TableDefault)
	}
	t, err := sqlident.ParseTable(s)
	if err != nil {
		return table{}, fmt.Errorf("%w name %v", ErrInvalidTable, err)
	}
	return table{quoted: t.Quoted, name: t.Name, full: s}, nil
}

func truncate(s string, n int) string { return textcut.Cut(s, n) }

// Schema returns the DDL that creates the outbox table of the given name in
// the default layout, LayoutLog (the same as LogSchema), as the top of
// Migrations, `outbox schema` and Store.CreateSchemaIfAbsent do. Every
// statement is idempotent, so the script can be run more than once, and run
// on a log table of an older version it brings it up to date. RowsSchema
// is the rows layout's.
func Schema(tableName string) (string, error) {
	return LogSchema(tableName)
}

// RowsSchema returns the DDL that creates the outbox table of the given
// name in LayoutRows and its indexes, at the current version: the creation
// and every upgrade, in order, as in Migrations' rows/. Every statement is
// idempotent (IF NOT EXISTS), so the script can be run more than once, and
// run on a table of an older version it upgrades it.
func RowsSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.createSQL() + "\n" + t.orderSQL() + "\n" + t.scheduledSQL(), nil
}

// DropSchema returns the DDL that drops the outbox table of the given name
// and the objects beside it, of either layout: the down migration. Every
// statement is idempotent (IF EXISTS).
func DropSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.dropScheduledSQL() + t.dropSQL(), nil
}

// dropRowsSQL drops a table of the rows layout (the down migration of
// 000001 in rows/).
func (t table) dropRowsSQL() string { return "DROP TABLE IF EXISTS " + t.quoted + ";\n" }

// dropSQL drops the table and what Schema creates beside it, of either
// layout: the view first, which depends on the tables; the claim function;
// the tables (their partitions and sequences go with them); the functions
// of the triggers that check ids and, on an ordered table, take turns.
func (t table) dropSQL() string {
	l := t.logTables()
	return "DROP VIEW IF EXISTS " + l.view + ";\n" +
		"DROP FUNCTION IF EXISTS " + l.claimFn + logClaimArgs + ";\n" +
		"DROP TABLE IF EXISTS " + l.failed + ", " + l.settle + ", " + l.batch + ", " + l.meta + ";\n" +
		t.dropRowsSQL() +
		// Their triggers went with the table.
		"DROP FUNCTION IF EXISTS " + t.qualified(t.idCheck()) + "();\n" +
		"DROP FUNCTION IF EXISTS " + t.qualified(t.orderTrigger()) + "();\n"
}

// createSQL is the one definition of the table. The embedded migrations are
// this text for the default table; a test keeps them equal.
func (t table) createSQL() string {
	r := strings.NewReplacer("{table}", t.quoted, "{name}", t.name)
	return r.Replace(`CREATE TABLE IF NOT EXISTS {table} (
    id            uuid        PRIMARY KEY,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL DEFAULT '',
    exchange      text        NOT NULL DEFAULT '',
    routing_key   text        NOT NULL DEFAULT '',
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claimed_until timestamptz,
    claim_token   uuid,
    published_at  timestamptz,
    parked_at     timestamptz
);

-- Claims walk this index: it holds only rows that are neither published nor
-- parked, so published history does not slow them down.
CREATE INDEX IF NOT EXISTS "{name}_claim_idx" ON {table} (id)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- Parked rows, for operators and for counting what is pending.
CREATE INDEX IF NOT EXISTS "{name}_parked_idx" ON {table} (parked_at)
    WHERE published_at IS NULL AND parked_at IS NOT NULL;

-- Published rows by age, for purging.
CREATE INDEX IF NOT EXISTS "{name}_published_idx" ON {table} (published_at)
    WHERE published_at IS NOT NULL;
`)
}

// orderSQL is the second version of the table (migration 000002): a
// database-assigned order of the messages, seq, that claims follow and that
// ordered mode (StoreConfig.Ordering) keeps per key; the record of
// discarded messages; the held messages of blocked keys; and the indexes.
// Run on a table of the first version it upgrades it without rewriting it
// (seq has no default for the rows already there, held a constant one), and
// only the rows not yet published are numbered, in the order of their ids.
// CREATE INDEX reads the whole table: on a large one, create the indexes
// CONCURRENTLY first. Writers need USAGE on the new sequence.
func (t table) orderSQL() string {
	r := strings.NewReplacer("{table}", t.quoted, "{seq}", t.qualified(t.name+"_seq"),
		"{seqname}", strings.ReplaceAll(t.qualified(t.name+"_seq"), "'", "''"), "{claim_idx}", t.qualified(t.name+"_claim_idx"), "{name}", t.name)
	return r.Replace(`-- The order the database assigns to messages as they are written: claims
-- follow it, and ordered mode keeps it per key. The roles that write events
-- need USAGE on the sequence (GRANT USAGE ON SEQUENCE ... TO ...). Keep its
-- CACHE at 1: sessions caching blocks of numbers would hand a later writer
-- a smaller one.
CREATE SEQUENCE IF NOT EXISTS {seq};
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE {table} ALTER COLUMN seq SET DEFAULT nextval('{seqname}');
ALTER SEQUENCE {seq} OWNED BY {table}.seq;

-- When an operator gave up on a parked message (Store.Discard); the row is
-- kept, with its attempts and last error.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS discarded_at timestamptz;

-- Ordered mode sets aside the messages of a key whose first message failed
-- (held), so that claims do not walk over them until it is published,
-- retried or discarded.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false;

-- Rows written before this version that are still to be published take
-- their order from their time-ordered ids, before every later row.
UPDATE {table} AS o SET seq = n.seq
FROM (SELECT id, nextval('{seqname}') AS seq
      FROM (SELECT id FROM {table} WHERE seq IS NULL AND published_at IS NULL ORDER BY id) AS p) AS n
WHERE o.id = n.id;

-- Claims walk this index, in the order of seq: it holds only rows that are
-- neither published, nor parked, nor held, so that neither published
-- history nor the messages of blocked keys slow them down.
DROP INDEX IF EXISTS {claim_idx};
CREATE INDEX IF NOT EXISTS "{name}_claim_seq_idx" ON {table} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL AND NOT held;

-- Ordered mode finds the first unpublished message of a key here.
CREATE INDEX IF NOT EXISTS "{name}_key_idx" ON {table} (event_key, seq)
    WHERE published_at IS NULL AND event_key <> '';

-- The held messages, by key.
CREATE INDEX IF NOT EXISTS "{name}_held_idx" ON {table} (event_key, seq)
    WHERE held AND published_at IS NULL AND parked_at IS NULL;
`)
}

// dropOrderSQL undoes orderSQL (the down migration of 000002).
func (t table) dropOrderSQL() string {
	r := strings.NewReplacer("{table}", t.quoted, "{claim_idx}", t.qualified(t.name+"_claim_idx"),
		"{seq_idx}", t.qualified(t.name+"_claim_seq_idx"), "{key_idx}", t.qualified(t.name+"_key_idx"),
		"{held_idx}", t.qualified(t.name+"_held_idx"), "{seq}", t.qualified(t.name+"_seq"))
	return r.Replace(`CREATE INDEX IF NOT EXISTS "` + t.name + `_claim_idx" ON {table} (id)
    WHERE published_at IS NULL AND parked_at IS NULL;
DROP INDEX IF EXISTS {seq_idx};
DROP INDEX IF EXISTS {key_idx};
DROP INDEX IF EXISTS {held_idx};
ALTER TABLE {table} DROP COLUMN IF EXISTS held;
ALTER TABLE {table} DROP COLUMN IF EXISTS discarded_at;
ALTER TABLE {table} DROP COLUMN IF EXISTS seq;
DROP SEQUENCE IF EXISTS {seq};
`)
}

// qualified returns the quoted name of an object in the table's schema
// (an index, a sequence, a function).
func (t table) qualified(name string) string {
	q := `"` + name + `"`
	if i := strings.IndexByte(t.quoted, '.'); i >= 0 {
		q = t.quoted[:i+1] + q
	}
	return q
}

// NotifyChannel returns the PostgreSQL notification channel on which the
// trigger of NotifySchema announces commits to the table.
func NotifyChannel(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.channel(), nil
}

func (t table) channel() string {
	ch := "outbox:" + t.full
	if len(ch) > 63 { // a channel name is an identifier: at most 63 bytes
		h := fnv.New32a()
		h.Write([]byte(t.full))
		ch = fmt.Sprintf("outbox:%s:%08x", t.full[:40], h.Sum32())
	}
	return ch
}

// trigger is the name of the NOTIFY trigger (and of its function).
func (t table) trigger() string { return t.name + "_notify" }

// NotifySchema returns DDL that makes every transaction inserting into the
// outbox table send a notification on NotifyChannel when it commits, so a
// relay can wake at once (see package pgwake) instead of at its next poll.
// It is optional and not part of Schema, because it has a cost: PostgreSQL
// serialises the commits of notifying transactions. Measured on a 2-core
// machine, one writer lost 2% of its throughput and eight concurrent
// writers lost half; see the README before turning it on for a write-heavy
// table. The statements are idempotent.
func NotifySchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	fn := t.qualified(t.trigger())
	r := strings.NewReplacer("{table}", t.quoted, "{fn}", fn, "{trigger}", `"`+t.trigger()+`"`, "{channel}", t.channel())
	return r.Replace(`CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
`), nil
}
