package outbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/acemq/outbox/internal/dialect"
)

// PoolerHint explains a prepared statement that "already exists" (42P05)
// or "does not exist" (26000): a transaction pooler hands the session's
// statements to other clients.
const PoolerHint = "a transaction pooler (PgBouncer, RDS Proxy, Supavisor) sits between this program and PostgreSQL, and pgx's statement cache does not survive it: add default_query_exec_mode=cache_describe to the database URL (see the README's \"Behind a connection pooler\")"

var (
	// ErrNoTransaction is returned when events would be written outside a
	// database transaction. Nothing has been written when it is returned:
	// open a transaction and write the business change and its events in it.
	ErrNoTransaction = errors.New("outbox: no open transaction: events are written only inside the transaction of the change they describe; begin one (db.Transaction, client.Tx) and write in it")

	// ErrNoPool is returned by the relay-side methods of a Store created
	// without its own *sql.DB.
	ErrNoPool = errors.New("outbox: store has no database pool: pass the relay's own *sql.DB to NewStore to claim, mark, count or purge")

	// ErrInvalidTable is returned, wrapped with the reason, when a table
	// name is not a plain, optionally schema-qualified, identifier ("invalid
	// table name …"), or when a table is not one this version of the
	// library can use: of neither layout, of a log layout of another
	// version, one whose objects or marker row were dropped or changed by
	// hand (the error says how to bring it up to date or mend it), or an
	// object the log layout makes beside an outbox table (its failed
	// table, a partition).
	ErrInvalidTable = errors.New("outbox: invalid table")

	// ErrInvalidEvent is returned, wrapped with the reason, when an event
	// cannot be written (no type, say). Nothing is written.
	ErrInvalidEvent = errors.New("outbox: invalid event")

	// ErrDuplicateID is returned, wrapped with the id, when an event's ID is
	// already in the table (or twice in one call). Like any failed
	// statement, a duplicate inside the table aborts the caller's
	// transaction (PostgreSQL's rule): roll it back; the event written
	// first stands. On LayoutLog the check is a unique index on each
	// partition and a trigger that looks in the others: a writer whose
	// snapshot cannot see the first write in another partition (a
	// REPEATABLE READ transaction begun before it committed, or two
	// writers at once whose events fall on either side of a partition
	// boundary, one every million events) is not refused.
	ErrDuplicateID = errors.New("outbox: duplicate event id")

	// ErrLeaseLost matches a *LeaseLostError with errors.Is.
	ErrLeaseLost = errors.New("outbox: lease lost")

	// ErrOrderingUnsafe is returned, wrapped with the reason, by
	// Store.CheckOrdering when the table cannot keep the order of ordered
	// mode as it is set up.
	ErrOrderingUnsafe = errors.New("outbox: the table cannot keep per-key order")

	// ErrUnsupportedDatabase is returned, wrapped with what was found, when
	// the library is given a database other than PostgreSQL, MySQL and
	// MariaDB, the ones it supports: NewStore with a *sql.DB whose driver
	// it can tell is another's (SQLite's, say), gormoutbox's
	// Plugin.Initialize on another GORM dialector, and entoutbox's hook on
	// an ent driver of another dialect; and when a Store on MySQL is asked
	// for what only PostgreSQL has (ordered tables, the log layout).
	ErrUnsupportedDatabase = dialect.ErrUnsupported
)

// LeaseLostError reports messages that MarkPublished, MarkFailed or Release
// left alone because they no longer carry the caller's claim: the lease ran
// out and another claimer took them (or they were already published). Those
// rows now belong to the other claimer; the caller must not act on them.
//
// For MarkPublished this means the message may be published twice, which the
// at-least-once promise allows; it is never lost.
type LeaseLostError struct {
	// IDs are the messages whose claim was lost.
	IDs []string
}

func (e *LeaseLostError) Error() string {
	ids := e.IDs
	more := ""
	if len(ids) > 5 {
		more = fmt.Sprintf(" and %d more", len(ids)-5)
		ids = ids[:5]
	}
	return fmt.Sprintf("outbox: lease lost on %d message(s) (%s%s): another claimer took them after the lease expired; use a longer lease if this repeats", len(e.IDs), strings.Join(ids, ", "), more)
}

// Is makes errors.Is(err, ErrLeaseLost) true for a *LeaseLostError.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }
