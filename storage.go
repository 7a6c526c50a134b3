package outbox

import (
	"context"
	"database/sql"
	"fmt"
)

// storage is the seam between a Store and the database its table is in,
// chosen once by NewStore from the database the store speaks: pgStorage
// on PostgreSQL, where the layout the table records (see Store.Layout)
// chooses which operations do the work, and backendStorage on a database
// whose tables a backend of package backend keeps (MySQL's: one kind of
// table). Store validates what it is given, holds the neutral logic and
// calls these; none of its methods asks which database or layout it has.
// Another database is another backend.Backend and a case of newBackend,
// not a change to Store.
type storage interface {
	// ops returns the operations of the table's kind (see layoutOps),
	// read from the table once.
	ops(ctx context.Context) (layoutOps, error)
	// layout is Store.Layout.
	layout(ctx context.Context) (Layout, error)
	// forget makes the next call read the table's kind again.
	forget()
	// tableChanged forgets the table's kind when err says that the table
	// is not what a statement expected (it may have been converted while
	// the store ran), and returns err.
	tableChanged(err error) error

	// insertSQL is the statement that writes n rows of Add's eight
	// columns, built once per n.
	insertSQL(n int) string
	// explainWrite marks a unique violation of the table's message ids
	// with ErrDuplicateID (naming the id when the server does), and
	// explains what else a write's error may need explained.
	explainWrite(err error) error
	// lockKeys takes the turns of evts' keys before Add writes them into
	// an ordered table (see Store.Add).
	lockKeys(ctx context.Context, tx Execer, evts []Event) error

	// createSchema, createRowsSchema and createLogSchema are the bodies
	// of CreateSchemaIfAbsent, CreateRowsSchemaIfAbsent and
	// CreateLogSchemaIfAbsent.
	createSchema(ctx context.Context, db *sql.DB) error
	createRowsSchema(ctx context.Context, db *sql.DB) error
	createLogSchema(ctx context.Context, db *sql.DB) error
	// hasNotifyTrigger is HasNotifyTrigger: false on a database without
	// LISTEN/NOTIFY.
	hasNotifyTrigger(ctx context.Context, db *sql.DB) (bool, error)
	// schemaVersion is SchemaVersion (inspect.go).
	schemaVersion(ctx context.Context, db *sql.DB) (version, latest int, err error)
}

// backendStorage is a table kept by a backend of package backend: one kind
// of table (LayoutRows), whose operations are always backendOps.
type backendStorage struct{ b backendOps }

func (st backendStorage) ops(context.Context) (layoutOps, error) { return st.b, nil }

// layout is LayoutRows when the table exists.
func (st backendStorage) layout(ctx context.Context) (Layout, error) {
	db, err := st.b.pool()
	if err != nil {
		return 0, err
	}
	ok, err := st.b.be.Exists(ctx, db)
	switch {
	case err != nil:
		return 0, fmt.Errorf("outbox: reading the layout of %s: %w", st.b.t.full, err)
	case !ok:
		return 0, noTableError{st.b.t.full}
	}
	return LayoutRows, nil
}

// forget and tableChanged do nothing: the table has one kind.
func (backendStorage) forget()                      {}
func (backendStorage) tableChanged(err error) error { return err }

func (st backendStorage) insertSQL(n int) string { return st.b.be.InsertSQL(n) }

func (st backendStorage) explainWrite(err error) error {
	if id, ok := st.b.be.DuplicateID(err); ok {
		return fmt.Errorf("%w: %s is already in %s: %w", ErrDuplicateID, id, st.b.t.full, err)
	}
	return err
}

func (st backendStorage) lockKeys(ctx context.Context, tx Execer, evts []Event) error {
	return st.b.takeTurns(ctx, tx, evts)
}

// createSchema creates the table's one kind, as MySQLSchema says, with
// its table of delayed messages.
func (st backendStorage) createSchema(ctx context.Context, db *sql.DB) error {
	defer st.b.scheduledMayExist()
	return st.b.createRowsSchema(ctx, db)
}

func (st backendStorage) createRowsSchema(ctx context.Context, db *sql.DB) error {
	return st.createSchema(ctx, db)
}

func (st backendStorage) createLogSchema(context.Context, *sql.DB) error {
	return st.b.errNotOnBackend("creating a table of the log layout")
}

// hasNotifyTrigger is false: LISTEN/NOTIFY is PostgreSQL's.
func (backendStorage) hasNotifyTrigger(context.Context, *sql.DB) (bool, error) { return false, nil }
