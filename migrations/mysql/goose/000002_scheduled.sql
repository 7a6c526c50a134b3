-- The outbox table of github.com/acemq/outbox (table "outbox") on MySQL and MariaDB, unordered.
-- Generated from outbox.MySQLSchema; `outbox schema --database-url mysql://... --table NAME` prints it for another name,
-- and with --ordered the trigger that makes it an ordered table. golang-migrate runs a file of
-- several statements when the DSN has multiStatements=true.

-- +goose Up
CREATE TABLE IF NOT EXISTS `outbox_scheduled` (
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
    due           DATETIME(6)   NOT NULL,
    -- refused: due, and not moved: its ID was written into the table
    -- meanwhile (last_error says so); it stays for an operator.
    refused       BOOLEAN       NOT NULL DEFAULT FALSE,
    last_error    TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY id_idx (id),
    KEY due_idx (refused, due)
) ENGINE=InnoDB COMMENT='acemq/outbox mysql v1: the delayed messages of the outbox table'
;

-- +goose Down
DROP TABLE IF EXISTS `outbox_scheduled`;
