package main

import (
	"fmt"
	"strings"
)

// verifySQL is verify's own statements (the heartbeat, the inbox's effects,
// reading the scratch table, removing a run) in the dialect of its
// database: PostgreSQL's, or with mysql MySQL's and MariaDB's. Every name
// in them is a run's scratch name (verifyTablePrefix and 8 hex digits, and
// a fixed suffix), never user input.
type verifySQL struct{ mysql bool }

// quote quotes a scratch name.
func (d verifySQL) quote(name string) string {
	if d.mysql {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// createAlive creates the heartbeat table of a run with its one row.
func (d verifySQL) createAlive(table string) []string {
	alive := d.quote(table + "_alive")
	if d.mysql {
		return []string{`CREATE TABLE ` + alive + ` (at DATETIME(6) NOT NULL) ENGINE=InnoDB`,
			`INSERT INTO ` + alive + ` VALUES (UTC_TIMESTAMP(6))`}
	}
	return []string{`CREATE TABLE ` + alive + ` (at timestamptz NOT NULL)`, `INSERT INTO ` + alive + ` VALUES (now())`}
}

// beat freshens the heartbeat.
func (d verifySQL) beat(table string) string {
	if d.mysql {
		return `UPDATE ` + d.quote(table+"_alive") + ` SET at = GREATEST(at, UTC_TIMESTAMP(6))`
	}
	return `UPDATE ` + d.quote(table+"_alive") + ` SET at = greatest(at, now())`
}

// keep makes the heartbeat never go stale (--keep).
func (d verifySQL) keep(table string) string {
	if d.mysql {
		return `UPDATE ` + d.quote(table+"_alive") + ` SET at = '9999-12-31 00:00:00'`
	}
	return `UPDATE ` + d.quote(table+"_alive") + ` SET at = 'infinity'`
}

// stale says, given the microseconds a heartbeat may be silent, whether the
// run's heartbeat is older (NULL: no row).
func (d verifySQL) stale(table string) string {
	if d.mysql {
		return `SELECT MAX(at) < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND FROM ` + d.quote(table+"_alive")
	}
	return `SELECT max(at) < now() - $1::bigint * interval '1 microsecond' FROM ` + d.quote(table+"_alive")
}

// hasAlive says whether the run's heartbeat table exists; its one argument
// is the table's name.
func (d verifySQL) hasAlive(table string) (query string, arg any) {
	if d.mysql {
		return `SELECT COUNT(*) > 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, table + "_alive"
	}
	return `SELECT to_regclass($1) IS NOT NULL`, d.quote(table + "_alive")
}

// runs lists the suffixes of the runs whose tables are in the database.
func (d verifySQL) runs() string {
	if d.mysql {
		return `SELECT DISTINCT SUBSTRING(table_name, ` + fmt.Sprint(len(verifyTablePrefix)+1) + `, 8)
FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name REGEXP '^` + verifyTablePrefix + `[0-9a-f]{8}(_|$)'`
	}
	return `SELECT DISTINCT substring(c.relname from '^` + verifyTablePrefix + `([0-9a-f]{8})(_|$)')
FROM pg_class AS c
WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND c.relkind IN ('r', 'p') AND c.relname ~ '^` + verifyTablePrefix + `[0-9a-f]{8}(_|$)'`
}

// dropRun drops every table of the run of the given scratch table, the
// heartbeat last.
func (d verifySQL) dropRun(table string) []string {
	if d.mysql { // the order trigger goes with its table
		return []string{fmt.Sprintf("DROP TABLE IF EXISTS `%[1]s`, `%[1]s_keys`, `%[1]s_scheduled`, `%[1]s_inbox`, `%[1]s_effects`", table),
			fmt.Sprintf("DROP TABLE IF EXISTS `%s_alive`", table)}
	}
	return []string{dropScratch(table) + fmt.Sprintf(`; DROP TABLE IF EXISTS "%[1]s_inbox", "%[1]s_effects"; DROP FUNCTION IF EXISTS "%[1]s_order"(); DROP TABLE IF EXISTS "%[1]s_alive"`, table)}
}

// readTable reads the committed events' ids and keys in the table's order.
func (d verifySQL) readTable(table string) string {
	if d.mysql {
		return `SELECT id, event_key FROM ` + d.quote(table) + ` ORDER BY seq`
	}
	return `SELECT id::text, event_key FROM ` + d.quote(table) + ` ORDER BY seq`
}

// effects creates the inbox's table of effects, records one, and counts
// them by message.
func (d verifySQL) effects(table string) (create, insert, count string) {
	t := d.quote(table + "_effects")
	create, insert = `CREATE TABLE `+t+` (message_id text NOT NULL)`, `INSERT INTO `+t+` VALUES ($1)`
	if d.mysql {
		create, insert = `CREATE TABLE `+t+` (message_id VARCHAR(64) NOT NULL) ENGINE=InnoDB`, `INSERT INTO `+t+` VALUES (?)`
	}
	return create, insert, `SELECT message_id, count(*) FROM ` + t + ` GROUP BY message_id`
}

// sessionsOf lists the MySQL sessions of the given client ports (those
// that came through verify's proxy: the relays'); PostgreSQL's relays are
// known by their application_name instead.
func (d verifySQL) sessionsOf(ports []int) (query string, args []any) {
	marks := strings.TrimSuffix(strings.Repeat("?,", len(ports)), ",")
	for _, p := range ports {
		args = append(args, fmt.Sprint(p))
	}
	return `SELECT id FROM information_schema.processlist WHERE SUBSTRING_INDEX(host, ':', -1) IN (` + marks + `)`, args
}
