-- The inbox table of github.com/acemq/outbox/inbox (table "inbox") on MySQL and MariaDB.
-- Generated from inbox.MySQLSchema; `outbox inbox schema --database-url mysql://... --table NAME` prints it for another name.

CREATE TABLE IF NOT EXISTS `inbox` (
    consumer    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    received_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    handled_at  DATETIME(6)  NULL,
    attempts    INT          NOT NULL DEFAULT 0,
    last_error  TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    dead_at     DATETIME(6)  NULL,
    PRIMARY KEY (consumer, message_id),
    KEY received_idx (received_at)
) ENGINE=InnoDB;
