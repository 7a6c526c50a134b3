-- The outbox table of github.com/acemq/outbox (table "outbox") on MySQL and MariaDB, unordered.
-- Generated from outbox.MySQLSchema; `outbox schema --database-url mysql://... --table NAME` prints it for another name,
-- and with --ordered the trigger that makes it an ordered table. golang-migrate runs a file of
-- several statements when the DSN has multiStatements=true.

DROP TABLE IF EXISTS `outbox_scheduled`;
