-- The inbox table of github.com/acemq/outbox/inbox (table "inbox") on MySQL and MariaDB.
-- Generated from inbox.MySQLSchema; `outbox inbox schema --database-url mysql://... --table NAME` prints it for another name.

DROP TABLE IF EXISTS `inbox`;
