package inbox

import (
	"context"
	"database/sql"
	"strings"
)

// On MySQL and MariaDB (a *sql.DB of go-sql-driver/mysql) the inbox keeps
// the same table and the same promise; only the statements differ:
// placeholders, UTC_TIMESTAMP(6) for now(), ON DUPLICATE KEY UPDATE for
// ON CONFLICT, and no RETURNING, so that recording a delivery takes two
// statements (the upsert, which locks the row for the transaction, then a
// locking read of it) and counting a failure two.

// mysqlNow is the database's clock in UTC; columns are DATETIME(6).
const mysqlNow = `UTC_TIMESTAMP(6)`

func mysqlMicros(col string) string {
	return `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ` + col + `)`
}

// mysqlQueries are the statements of an inbox table on MySQL.
func (ib *Inbox) mysqlQueries(quoted string) {
	r := strings.NewReplacer("{table}", quoted, "{now}", mysqlNow)
	// A new row is inserted unhandled; the read after it says so, and the
	// handler's attempt marks it (q.retry), as for a row of a failed
	// delivery. The upsert locks the row, new or not, until the
	// transaction ends; the read is a locking one, so that it sees the
	// row as the delivery that held it committed it, whatever snapshot
	// the transaction holds.
	ib.q.claim = r.Replace(`INSERT INTO {table} (consumer, message_id) VALUES (?, ?) ON DUPLICATE KEY UPDATE consumer = consumer`)
	ib.q.claimRead = r.Replace(`SELECT FALSE, handled_at IS NOT NULL, dead_at IS NOT NULL FROM {table} WHERE consumer = ? AND message_id = ? FOR UPDATE`)
	ib.q.retry = r.Replace(`UPDATE {table} SET handled_at = {now} WHERE consumer = ? AND message_id = ?`)
	// dead_at before attempts: MySQL assigns from left to right, each
	// expression seeing the columns assigned before it.
	ib.q.failed = r.Replace(`INSERT INTO {table} (consumer, message_id, attempts, last_error, dead_at)
VALUES (?, ?, 1, ?, CASE WHEN 1 >= ? THEN {now} END)
ON DUPLICATE KEY UPDATE dead_at = CASE WHEN attempts + 1 >= ? THEN {now} END, attempts = attempts + 1, last_error = ?`)
	ib.q.failedRead = r.Replace(`SELECT attempts, dead_at IS NOT NULL FROM {table} WHERE consumer = ? AND message_id = ?`)
	ib.q.handled = r.Replace(`SELECT handled_at IS NOT NULL FROM {table} WHERE consumer = ? AND message_id = ?`)
	ib.q.revive = r.Replace(`UPDATE {table} SET dead_at = NULL, attempts = 0 WHERE consumer = ? AND message_id = ? AND dead_at IS NOT NULL`)
	ib.q.reviveAll = r.Replace(`UPDATE {table} SET dead_at = NULL, attempts = 0 WHERE consumer = ? AND dead_at IS NOT NULL`)
	ib.q.dead = r.Replace(`SELECT message_id, attempts, coalesce(last_error, ''), ` + mysqlMicros("received_at") + `, ` + mysqlMicros("dead_at") + ` FROM {table}
WHERE consumer = ? AND dead_at IS NOT NULL
  AND (? = 0 OR (dead_at, message_id) > (TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND, ?))
ORDER BY dead_at, message_id LIMIT ?`)
	ib.q.records = r.Replace(`SELECT coalesce(sum(handled_at IS NOT NULL), 0), coalesce(sum(handled_at IS NULL AND dead_at IS NULL), 0),
	coalesce(sum(dead_at IS NOT NULL), 0) FROM {table} WHERE consumer = ?`)
	ib.q.purgeable = r.Replace(`SELECT count(*) FROM {table}
WHERE consumer = ? AND received_at < {now} - INTERVAL ? MICROSECOND
  AND (handled_at IS NOT NULL OR dead_at IS NOT NULL)`)
	ib.q.purge = r.Replace(`DELETE FROM {table}
WHERE consumer = ? AND received_at < {now} - INTERVAL ? MICROSECOND
  AND (handled_at IS NOT NULL OR dead_at IS NOT NULL)
ORDER BY received_at
LIMIT ?`)
}

// record takes the delivery's row for the transaction and says what it
// holds: inserted (by this statement, handled already), handled, dead.
func (ib *Inbox) record(ctx context.Context, tx *sql.Tx, id string) (inserted, handled, dead bool, err error) {
	if ib.mysql {
		if _, err := tx.ExecContext(ctx, ib.q.claim, ib.consumer, id); err != nil {
			return false, false, false, err
		}
		err = tx.QueryRowContext(ctx, ib.q.claimRead, ib.consumer, id).Scan(&inserted, &handled, &dead)
		return inserted, handled, dead, err
	}
	err = tx.QueryRowContext(ctx, ib.q.claim, ib.consumer, id).Scan(&inserted, &handled, &dead)
	return inserted, handled, dead, err
}

// countFailure counts a failed attempt at id, dead-lettering it at limit.
func (ib *Inbox) countFailure(ctx context.Context, id, reason string, limit int) (attempts int, dead bool, err error) {
	if ib.mysql {
		if _, err := ib.db.ExecContext(ctx, ib.q.failed, ib.consumer, id, reason, limit, limit, reason); err != nil {
			return 0, false, err
		}
		err = ib.db.QueryRowContext(ctx, ib.q.failedRead, ib.consumer, id).Scan(&attempts, &dead)
		return attempts, dead, err
	}
	err = ib.db.QueryRowContext(ctx, ib.q.failed, ib.consumer, id, reason, limit).Scan(&attempts, &dead)
	return attempts, dead, err
}

// deadAmongQuery is the count of DeadAmong and its arguments.
func (ib *Inbox) deadAmongQuery(ids []string) (string, []any) {
	if !ib.mysql {
		return ib.q.deadAmong, []any{ib.consumer, ids}
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, ib.consumer)
	for _, id := range ids {
		args = append(args, id)
	}
	return `SELECT count(*) FROM ` + ib.table + ` WHERE consumer = ? AND message_id IN (` +
		strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + `) AND dead_at IS NOT NULL`, args
}

// MySQLSchema returns the DDL of an inbox table of the given name on
// MySQL or MariaDB: one idempotent statement. A consumer's name and a
// message id are at most 255 characters there (the primary key holds
// both).
func MySQLSchema(table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return strings.NewReplacer("{table}", mysqlQuoted(t.Quoted)).Replace(`CREATE TABLE IF NOT EXISTS {table} (
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
`), nil
}

// mysqlQuoted turns a name sqlident quoted for PostgreSQL ("a"."b") into
// MySQL's (`a`.`b`): its parts are plain identifiers, without quotes.
func mysqlQuoted(pg string) string { return strings.ReplaceAll(pg, `"`, "`") }
