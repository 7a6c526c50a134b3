package outbox

import (
	"database/sql"
	"fmt"
	"strings"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/mysqlstore"
)

// Database is the database an outbox table is kept in.
type Database int

const (
	// PostgreSQL, version 13 or later: both layouts, ordered tables,
	// LISTEN/NOTIFY wake-ups (package pgwake).
	PostgreSQL Database = iota + 1

	// MySQL, version 8.0 or later, and MariaDB, 10.6 or later (what
	// FOR UPDATE SKIP LOCKED needs): one table of one row per message
	// (LayoutRows), unordered; a relay in another process polls (see
	// relay.Config.PollInterval). Tested on MariaDB 10.11.
	MySQL
)

// String returns "PostgreSQL" or "MySQL".
func (d Database) String() string {
	switch d {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	}
	return fmt.Sprintf("Database(%d)", int(d))
}

// chooseDatabase is the database of a new Store: the one its pool's driver
// speaks, else the configured one, else PostgreSQL. A configuration that
// contradicts the pool is an error.
func chooseDatabase(db *sql.DB, configured Database, spoken string) (Database, error) {
	return chosen(db != nil, configured, spoken, "outbox: NewStore", "the *sql.DB's driver speaks")
}

// chosen is chooseDatabase of what the caller who was told (spoken:
// dialect.Check's answer; told: whether there was anything to tell from).
func chosen(told bool, configured Database, spoken, who, what string) (Database, error) {
	if configured != 0 && configured != PostgreSQL && configured != MySQL {
		return 0, fmt.Errorf("outbox: StoreConfig.Database must be PostgreSQL or MySQL (got %d)", int(configured))
	}
	found := Database(0)
	if told {
		switch spoken {
		case dialect.Unknown, dialect.Postgres:
			found = PostgreSQL
		case dialect.MySQL:
			found = MySQL
		}
	}
	switch {
	case found != 0 && configured != 0 && found != configured:
		return 0, fmt.Errorf("%s: the store's database is %s, and %s %s", who, configured, what, found)
	case found != 0:
		return found, nil
	case configured != 0:
		return configured, nil
	}
	return PostgreSQL, nil
}

// newBackend returns the backend of a table on a database other than
// PostgreSQL (whose two layouts are rowsOps and logOps), nil on PostgreSQL.
func newBackend(d Database, t table) backend.Backend {
	if d != MySQL {
		return nil
	}
	schema, _, _ := strings.Cut(t.full, ".")
	if schema == t.full {
		schema = ""
	}
	return mysqlstore.New(schema, t.name)
}

// MySQLSchema returns the DDL that creates the outbox table of the given
// name on MySQL or MariaDB (see MySQL), unordered: the table and the table
// of its keys' turns, each statement idempotent, as `outbox schema
// --database-url mysql://…` prints it and Store.CreateSchemaIfAbsent
// applies it. A schema-qualified name ("billing.outbox") names a database.
func MySQLSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	be := newBackend(MySQL, t)
	return mysqlstore.Script(append(be.SchemaStatements(), be.ScheduleStatements()...)), nil
}

// MySQLOrderSchema returns the DDL that makes the MySQL outbox table of the
// given name an ordered table (see OrderedByKey): its order trigger, which
// takes each writer's key's turn and numbers the message in its key's
// order, whatever program writes. Run it once, after MySQLSchema (CREATE
// TRIGGER is not idempotent on MySQL 8.0); on a table in use prefer
// Store.ConvertOrdering (`outbox convert --to ordered`), which creates it
// only when it is not there. With the mysql client, run it between
// DELIMITER // and DELIMITER ;.
func MySQLOrderSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return mysqlstore.Script(newBackend(MySQL, t).OrderStatements()), nil
}

// Database returns the database the store's table is in.
func (s *Store) Database() Database { return s.database }
