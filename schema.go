package outbox

import (
	"embed"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/acemq/outbox/internal/sqlident"
)

// TableDefault is the outbox table used when no name is configured.
const TableDefault = "outbox"

// Migrations holds the schema of the default "outbox" table as plain SQL
// files, in the layout golang-migrate and Atlas read
// (NNN_name.up.sql / NNN_name.down.sql) and, under goose/, in goose's
// annotated form. Copy them into the migrations of your application, or
// print the DDL for another table name with Schema or `outbox schema`.
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
		return table{}, fmt.Errorf("%w: the name is empty; leave StoreConfig.Table unset for %q", ErrInvalidTable, TableDefault)
	}
	t, err := sqlident.ParseTable(s)
	if err != nil {
		return table{}, fmt.Errorf("%w %v", ErrInvalidTable, err)
	}
	return table{quoted: t.Quoted, name: t.Name, full: s}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Schema returns the DDL that creates the outbox table of the given name and
// its indexes. Every statement is idempotent (IF NOT EXISTS), so the script
// can be run more than once.
func Schema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.createSQL(), nil
}

// DropSchema returns the DDL that drops the outbox table of the given name.
func DropSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return "DROP TABLE IF EXISTS " + t.quoted + ";\n", nil
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
	fn := `"` + t.trigger() + `"`
	if i := strings.IndexByte(t.quoted, '.'); i >= 0 {
		fn = t.quoted[:i+1] + fn
	}
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
