package relay

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dberr"
)

// fatal reports whether err ends Run: nothing that happens while it runs
// can repair it (misuse: a closed publisher or *sql.DB, a store without a
// pool, a table that is not an outbox table of this version).
func fatal(err error) bool {
	return errors.Is(err, ErrPublisherClosed) || errors.Is(err, outbox.ErrNoPool) ||
		errors.Is(err, outbox.ErrInvalidTable) || errors.Is(err, errDBClosed())
}

// missing says that err is the database's: the table, its schema or a
// column of it is not there.
func missing(err error) bool {
	switch dberr.Classify(err) {
	case dberr.NoTable, dberr.NoSchema, dberr.NoColumn:
		return true
	}
	return false
}

// explain is the error Run returns for a fatal err: err itself, said more
// plainly where database/sql's own words would leave a reader guessing.
func explain(err error) error {
	if errors.Is(err, errDBClosed()) {
		return fmt.Errorf("relay: the store's *sql.DB was closed while the relay used it (close it only after Run returned): %w", err)
	}
	return err
}

// errDBClosed is database/sql's error for a closed *sql.DB ("sql: database
// is closed"), which it does not export: provoked once, when first asked
// for (not when a program that imports the package starts), from a pool
// without a driver that is closed before its first use. database/sql
// returns that one value, and the store wraps it, so errors.Is finds it.
var errDBClosed = sync.OnceValue(func() error {
	db := sql.OpenDB(noConnector{})
	_ = db.Close()
	return db.PingContext(context.Background())
})

// noConnector is a driver.Connector that never connects.
type noConnector struct{}

func (noConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("relay: no connection")
}
func (noConnector) Driver() driver.Driver { return nil }

// Advice returns what a person has to do when err will not go away by
// waiting (a password, a permission, a missing database, vhost or table),
// or "" for a failure that retrying can cure. The relay logs such errors
// at error level, with the advice, and still retries them.
func Advice(err error) string { return permanent(err) }

// permanent returns advice when err will not go away by waiting (a person
// has to change a password, a permission or the schema), or "". The relay
// still retries such errors, as the fix may come while it runs, but logs
// them at error level as permanent.
func permanent(err error) string {
	if err == nil {
		return ""
	}
	switch dberr.Classify(err) {
	case dberr.Credentials:
		return dberr.Database(err) + " refused the credentials: check the database URL's user and password"
	case dberr.NoDatabase:
		return "the database does not exist: check the database URL"
	case dberr.NoSchema:
		return "the schema does not exist: create it or fix the table name"
	case dberr.NoPrivilege:
		return "the database user lacks a privilege on the outbox table: GRANT SELECT, UPDATE, DELETE on it"
	case dberr.NoTable:
		return "the outbox table does not exist: create it with `outbox schema --apply` or your migrations"
	case dberr.NoColumn:
		return "the outbox table lacks a column: it was not created by this version's schema; apply the migrations"
	case dberr.Pooler:
		return outbox.PoolerHint
	case dberr.ReadOnly:
		return "the database accepts no writes (a standby, a replica, or a node left read-only by a failover): point the database URL at the primary (PostgreSQL: list every host and add target_session_attrs=read-write)"
	}
	switch {
	case errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrSASL):
		return "RabbitMQ refused the credentials: check the AMQP URL's user and password"
	case errors.Is(err, amqp.ErrVhost):
		return "the user has no access to the vhost, or it does not exist: check the AMQP URL's vhost and the user's permissions"
	}
	return ""
}
