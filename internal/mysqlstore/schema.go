package mysqlstore

import (
	"strings"
)

// SchemaMarker is the table comment that says the table is an outbox of
// this backend, and of which version.
const SchemaMarker = "acemq/outbox mysql v1"

// replacer fills in the names of the table's objects.
func (s *Store) replacer() *strings.Replacer {
	return strings.NewReplacer("{table}", s.quoted, "{keys}", s.keys, "{trigger}", s.trigger, "{marker}", SchemaMarker)
}

// SchemaStatements implements backend.Backend: the table, its indexes and
// the table of its keys' turns, each statement idempotent (IF NOT
// EXISTS). The table is unordered; OrderStatements makes it ordered.
//
// The columns take what Add accepts: text of up to 255 bytes (event type,
// exchange, routing key, content type), a key of up to 2,048 bytes, kept
// as bytes so that an index on it fits InnoDB's 3,072 bytes, headers as a
// JSON object. Ids are UUIDs as text, in ASCII with a binary collation.
func (s *Store) SchemaStatements() []string {
	r := s.replacer()
	return []string{r.Replace(`CREATE TABLE IF NOT EXISTS {table} (
    seq           BIGINT        NOT NULL AUTO_INCREMENT,
    id            CHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_type    VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_key     VARBINARY(2048) NOT NULL DEFAULT '',
    exchange      VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    routing_key   VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    payload       LONGBLOB      NOT NULL,
    content_type  VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'application/json',
    headers       JSON          NOT NULL,
    created_at    DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at  DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    attempts      INT           NOT NULL DEFAULT 0,
    last_error    TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    claimed_until DATETIME(6)   NULL,
    claim_token   CHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NULL,
    published_at  DATETIME(6)   NULL,
    parked_at     DATETIME(6)   NULL,
    discarded_at  DATETIME(6)   NULL,
    -- On an ordered table: the message's place in its key's order, given
    -- by the order trigger when the writer has its key's turn (0: no key,
    -- or written while the table was unordered); held, set aside behind
    -- a failed message of its key.
    ord           BIGINT        NOT NULL DEFAULT 0,
    held          BOOLEAN       NOT NULL DEFAULT FALSE,
    PRIMARY KEY (seq),
    -- A message's id is unique: Add refuses one already written.
    UNIQUE KEY id_idx (id),
    -- Claims walk the entries whose published_at and parked_at are NULL
    -- and held false, in the order of seq; parked rows follow them, then
    -- the published history by age (purges).
    KEY state_idx (published_at, parked_at, held, seq),
    -- Ordered mode reads a key's unpublished messages in their order.
    KEY key_idx (event_key, published_at, ord)
) ENGINE=InnoDB COMMENT='{marker}'`),
		// A key's row is its turn: the order trigger locks it (an upsert)
		// until the writer's transaction ends, and numbers the writer's
		// message from it.
		r.Replace(`CREATE TABLE IF NOT EXISTS {keys} (
    event_key VARBINARY(2048) NOT NULL,
    last      BIGINT          NOT NULL DEFAULT 0,
    PRIMARY KEY (event_key)
) ENGINE=InnoDB COMMENT='{marker}: the turns of the keys of the outbox table'`),
	}
}

// OrderStatements makes the table ordered: its trigger, which every
// writer's INSERT runs, whatever program writes, takes the key's turn (the
// key's row, locked until the writer commits or rolls back: a second
// writer of the key waits) and numbers the message in its key's order.
// CREATE TRIGGER is not idempotent on MySQL 8.0 before 8.0.29: the store
// runs it only when the trigger is not there.
func (s *Store) OrderStatements() []string {
	return []string{s.replacer().Replace(`CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW
BEGIN
    IF NEW.event_key <> '' THEN
        INSERT INTO {keys} (event_key, last) VALUES (NEW.event_key, 1)
            ON DUPLICATE KEY UPDATE last = last + 1;
        SET NEW.ord = (SELECT last FROM {keys} WHERE event_key = NEW.event_key);
    END IF;
END`)}
}

// UnorderStatements makes the table unordered.
func (s *Store) UnorderStatements() []string {
	return []string{"DROP TRIGGER IF EXISTS " + s.trigger}
}

// Script joins statements as a script to print or to keep as a migration:
// each ends with ";" on a line of its own when it holds semicolons (a
// trigger's body), so that golang-migrate (multiStatements=true) and goose
// (StatementBegin/End) run it whole; the mysql client needs DELIMITER
// around such a statement.
func Script(stmts []string) string {
	var b strings.Builder
	for _, st := range stmts {
		b.WriteString(st)
		if strings.Contains(st, ";") {
			b.WriteString("\n")
		}
		b.WriteString(";\n")
	}
	return b.String()
}

// DropStatements implements backend.Backend: the trigger goes with the
// table.
func (s *Store) DropStatements() []string {
	return []string{"DROP TABLE IF EXISTS " + s.quoted, "DROP TABLE IF EXISTS " + s.keys}
}
