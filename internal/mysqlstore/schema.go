package mysqlstore

import (
	"strings"
)

// SchemaMarker is the table comment that says the table is an outbox of
// this backend, and of which version.
const SchemaMarker = "acemq/outbox mysql v1"

// SchemaSQL implements backend.Backend: the table and its indexes, in one
// idempotent statement (CREATE TABLE IF NOT EXISTS).
//
// The columns take what Add accepts: text of up to 255 bytes (event type,
// exchange, routing key, content type), a key of up to 2,048 bytes, kept
// as bytes so that an index on it fits InnoDB's 3,072 bytes, headers as a
// JSON object. Ids are UUIDs as text, in ASCII with a binary collation.
func (s *Store) SchemaSQL() string {
	return strings.NewReplacer("{table}", s.quoted, "{marker}", SchemaMarker).Replace(`CREATE TABLE IF NOT EXISTS {table} (
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
    PRIMARY KEY (seq),
    -- A message's id is unique: Add refuses one already written.
    UNIQUE KEY id_idx (id),
    -- Claims walk the entries whose published_at and parked_at are both
    -- NULL, in the order of seq; parked rows follow them, then the
    -- published history by age (purges).
    KEY state_idx (published_at, parked_at, seq)
) ENGINE=InnoDB COMMENT='{marker}';
`)
}

// DropSQL implements backend.Backend.
func (s *Store) DropSQL() string { return "DROP TABLE IF EXISTS " + s.quoted + ";\n" }
