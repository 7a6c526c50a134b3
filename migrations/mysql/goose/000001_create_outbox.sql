-- The outbox table of github.com/acemq/outbox (table "outbox") on MySQL and MariaDB, unordered.
-- Generated from outbox.MySQLSchema; `outbox schema --database-url mysql://... --table NAME` prints it for another name,
-- and with --ordered the trigger that makes it an ordered table. golang-migrate runs a file of
-- several statements when the DSN has multiStatements=true.

-- +goose Up
CREATE TABLE IF NOT EXISTS `outbox` (
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
) ENGINE=InnoDB COMMENT='acemq/outbox mysql v1'
;
CREATE TABLE IF NOT EXISTS `outbox_keys` (
    event_key VARBINARY(2048) NOT NULL,
    last      BIGINT          NOT NULL DEFAULT 0,
    PRIMARY KEY (event_key)
) ENGINE=InnoDB COMMENT='acemq/outbox mysql v1: the turns of the keys of the outbox table';

-- +goose Down
DROP TABLE IF EXISTS `outbox`;
DROP TABLE IF EXISTS `outbox_keys`;
