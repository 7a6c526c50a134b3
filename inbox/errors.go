package inbox

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dberr"
)

var (
	// ErrNoMessageID is returned for a delivery without a message-id: it
	// cannot be deduplicated, so it is refused (nack without requeue)
	// rather than risk handling it twice.
	ErrNoMessageID = errors.New("inbox: the delivery has no message-id, so it cannot be deduplicated; it was refused (dead-lettered)")

	// ErrInvalidMessageID is returned for a delivery whose message-id
	// cannot be stored (not valid UTF-8, a NUL byte, or a value the
	// database refuses): it is refused (nack without requeue) at once, as
	// no redelivery can change it.
	ErrInvalidMessageID = errors.New("inbox: the delivery's message-id cannot be recorded; it was refused (dead-lettered)")

	// ErrInvalidTable is returned for a table name that is not a plain,
	// optionally schema-qualified, lowercase identifier.
	ErrInvalidTable = errors.New("inbox: invalid table name")

	// ErrHandlerRolledBack is the error of an attempt whose handler rolled
	// the inbox's transaction back itself instead of returning an error.
	// The attempt is counted. A handler returns its error and lets Handle
	// roll back.
	ErrHandlerRolledBack = errors.New("inbox: the handler rolled back the inbox's transaction itself; return an error instead and let Handle roll back")

	// ErrHandlerCommitted is returned, with the outcome Handled, when the
	// handler committed the inbox's transaction itself. The effect and the
	// record were committed together, so the message counts as handled,
	// but the handler must not commit: return nil and let Handle commit.
	ErrHandlerCommitted = errors.New("inbox: the handler committed the inbox's transaction itself; return nil and let Handle commit")
)

// Permanent marks a handler's error as the message's own fault that no
// retry can cure (a payload that does not parse, a reference to something
// that will never exist): Handle dead-letters the message at once, without
// waiting for MaxAttempts.
//
//	if err := json.Unmarshal(d.Body, &order); err != nil {
//		return inbox.Permanent(err)
//	}
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, permanent: true}
}

// Transient marks a handler's error as a passing fault outside the message
// (a service it calls is down): Handle rolls back and requeues the
// delivery without counting an attempt, and a Consumer backs off before
// it takes deliveries again, as after a database failure. A message whose
// handler only ever fails transiently is retried forever: mark only what
// waiting can cure.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err}
}

type classified struct {
	err       error
	permanent bool
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var c *classified
	return errors.As(err, &c) && c.permanent
}

// IsTransient reports whether err was marked with Transient.
func IsTransient(err error) bool {
	var c *classified
	return errors.As(err, &c) && !c.permanent
}

// PanicError is the error of an attempt whose handler panicked. The
// attempt is counted, as for an error the handler returned.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine stack at the panic
}

func (e *PanicError) Error() string { return fmt.Sprintf("inbox: the handler panicked: %v", e.Value) }

// checkMessageID returns why id cannot be recorded, or nil.
func checkMessageID(id string) error {
	switch {
	case id == "":
		return ErrNoMessageID
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: it is not valid UTF-8", ErrInvalidMessageID)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: it holds a NUL byte", ErrInvalidMessageID)
	}
	return nil
}

// retryAtOnce reports a serialization failure or a deadlock: the
// transaction lost a race, and running it again at once is the cure.
func retryAtOnce(err error) bool {
	k := dberr.Classify(err)
	return k == dberr.Serialization || k == dberr.Deadlock
}

// infrastructure reports whether err is a failure of the database or of
// the connection to it, not of the message: no attempt is counted for it.
func infrastructure(err error) bool {
	if err == nil {
		return false
	}
	if dberr.Database(err) != "" { // the server's answer says what it is
		switch dberr.Classify(err) {
		case dberr.Unavailable, dberr.Terminated, // the server, or the connection to it
			dberr.Serialization, dberr.Deadlock, // retried at once first
			dberr.ReadOnly,                                                                                        // a failover in progress
			dberr.LockNotAvailable,                                                                                // lock_timeout, innodb_lock_wait_timeout
			dberr.Pooler,                                                                                          // a pooler in the way of pgx's statement cache
			dberr.NoTable, dberr.NoColumn, dberr.NoPrivilege, dberr.NoSchema, dberr.NoDatabase, dberr.Credentials: // someone has to fix it, not the message
			return true
		}
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone), errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &ne):
		return true
	}
	// pgx reports a use of a connection the server closed as "conn closed".
	return strings.Contains(err.Error(), "conn closed")
}

// messageFault reports an error of the claim that only the message id can
// cause (a data exception, a value over a limit): redelivering cannot help.
func messageFault(err error) bool { return dberr.Classify(err) == dberr.BadData }

// advice returns what an operator should do about an infrastructure
// failure that waiting will not cure, or "".
func advice(err error) string {
	switch dberr.Classify(err) {
	case dberr.NoTable:
		return "the inbox table does not exist: create it with `outbox inbox schema --apply` or your migrations"
	case dberr.NoColumn:
		return "the inbox table lacks a column: it was not created by this version's schema"
	case dberr.NoPrivilege:
		return "the database user lacks a privilege on the inbox table: GRANT SELECT, INSERT, UPDATE, DELETE on it"
	case dberr.NoDatabase:
		return "the database does not exist: check the database URL"
	case dberr.NoSchema:
		return "the schema does not exist: create it or fix the table name"
	case dberr.Credentials:
		return dberr.Database(err) + " refused the credentials: check the database URL's user and password"
	case dberr.ReadOnly:
		return "the server is read-only (a replica, or a primary after a failover): point the consumer at the writable one"
	case dberr.Pooler:
		return outbox.PoolerHint
	}
	return ""
}
