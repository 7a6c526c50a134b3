// Package dberr classifies the errors of the databases the outbox runs on,
// so that no caller reads a driver's codes itself: PostgreSQL's SQLSTATE
// (pgx, lib/pq: read by package pgerr) and the error numbers of
// MySQL and MariaDB (go-sql-driver/mysql's *mysql.MySQLError). An error of
// neither is Other.
package dberr

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/acemq/outbox/internal/pgerr"
)

// Kind is what a database error means to the outbox.
type Kind int

const (
	Other            Kind = iota
	Credentials           // the server refused the user or the password
	NoDatabase            // the database does not exist (MySQL: also the database a table name names)
	NoSchema              // PostgreSQL's schema does not exist
	NoPrivilege           // the user lacks a privilege on the table
	NoTable               // the table does not exist
	NoColumn              // the table lacks a column
	NoFunction            // a function (of the log layout) does not exist
	Pooler                // a transaction pooler broke a session's state (PostgreSQL)
	Duplicate             // a unique key refused a row
	LockNotAvailable      // a lock wait ran out (lock_timeout, NOWAIT, innodb_lock_wait_timeout)
	Deadlock              // the server broke a deadlock by ending this transaction
	Serialization         // a serialization failure: the transaction may be tried again
	ReadOnly              // the server accepts no writes (a standby, a replica, a read-only node after a failover)
	Terminated            // an administrator or a shutdown ended the session
	Unavailable           // the server cannot serve now: a connection lost or refused, too many connections, out of memory or disk, a system error
	BadData               // the server refuses a value (too long, not valid in its type): the same value fails again
)

// Database says which server an error came from: "PostgreSQL", "MySQL"
// (MySQL or MariaDB) or "" for neither.
func Database(err error) string {
	switch {
	case pgerr.State(err) != "":
		return "PostgreSQL"
	case number(err) != 0:
		return "MySQL"
	}
	return ""
}

// number returns MySQL's (or MariaDB's) error number of err, or 0.
func number(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Classify says what err means.
func Classify(err error) Kind {
	if err == nil {
		return Other
	}
	if s := pgerr.State(err); s != "" {
		if k, ok := postgres[s]; ok {
			return k
		}
		return postgresClass(s)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		if k, ok := mysqlNumbers[me.Number]; ok {
			return k
		}
		switch string(me.SQLState[:2]) {
		case "08":
			return Unavailable
		case "22":
			return BadData
		}
	}
	return Other
}

// postgresClass is the kind of a SQLSTATE by its class (its first two
// characters), for the states postgres does not name.
func postgresClass(s string) Kind {
	switch {
	case strings.HasPrefix(s, "08"), // connection exception
		strings.HasPrefix(s, "53"),  // insufficient resources: too many connections, disk full, out of memory
		strings.HasPrefix(s, "57P"), // cannot connect now, database dropped
		strings.HasPrefix(s, "58"):  // system error
		return Unavailable
	case strings.HasPrefix(s, "22"), // data exception
		strings.HasPrefix(s, "54"): // program limit exceeded: a value too large
		return BadData
	}
	return Other
}

// postgres maps SQLSTATEs (PostgreSQL's appendix A) to kinds.
var postgres = map[string]Kind{
	"28P01": Credentials, "28000": Credentials,
	"3D000": NoDatabase, "3F000": NoSchema,
	"42501": NoPrivilege,
	"42P01": NoTable,
	"42703": NoColumn,
	"42883": NoFunction,
	"42P05": Pooler, "26000": Pooler, // a prepared statement that is, or is not, there
	"23505": Duplicate,
	"55P03": LockNotAvailable,
	"40P01": Deadlock,
	"40001": Serialization,
	"25006": ReadOnly,
	"57P01": Terminated, "57P02": Terminated, "57P03": Terminated,
}

// mysqlNumbers maps the server error numbers of MySQL and MariaDB to
// kinds.
var mysqlNumbers = map[uint16]Kind{
	1045: Credentials,                                       // ER_ACCESS_DENIED_ERROR
	1044: NoPrivilege,                                       // ER_DBACCESS_DENIED_ERROR
	1049: NoDatabase,                                        // ER_BAD_DB_ERROR
	1142: NoPrivilege, 1143: NoPrivilege, 1227: NoPrivilege, // table, column, SUPER-like
	1146: NoTable,          // ER_NO_SUCH_TABLE
	1054: NoColumn,         // ER_BAD_FIELD_ERROR
	1305: NoFunction,       // ER_SP_DOES_NOT_EXIST
	1062: Duplicate,        // ER_DUP_ENTRY
	1205: LockNotAvailable, // ER_LOCK_WAIT_TIMEOUT
	1213: Deadlock,         // ER_LOCK_DEADLOCK
	1290: ReadOnly,         // ER_OPTION_PREVENTS_STATEMENT (--read-only, --super-read-only)
	1792: ReadOnly,         // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	1836: ReadOnly,         // MariaDB's ER_READ_ONLY_MODE
	1053: Terminated,       // ER_SERVER_SHUTDOWN
	1927: Terminated,       // MariaDB's ER_CONNECTION_KILLED
	1040: Unavailable,      // ER_CON_COUNT_ERROR: too many connections
	1203: Unavailable,      // ER_TOO_MANY_USER_CONNECTIONS
	1041: Unavailable,      // ER_OUT_OF_RESOURCES
	1037: Unavailable,      // ER_OUTOFMEMORY
	1038: Unavailable,      // ER_OUT_OF_SORTMEMORY
	1021: Unavailable,      // ER_DISK_FULL
	1114: Unavailable,      // ER_RECORD_FILE_FULL: the table is full
}
