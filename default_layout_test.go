package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// requireWorks writes two events through store and claims and publishes
// them.
func requireWorks(t *testing.T, db *sql.DB, store *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	b := &testBundle{db: db, store: store}
	b.addCommitted(t, events(2)...)
	msgs, err := store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.NoError(t, store.MarkPublished(ctx, msgs...))
	n, err := store.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// Issue 38, item 2: one default layout. Schema, CreateSchemaIfAbsent, the
// top of Migrations (and `outbox schema`) create the log layout; the rows
// layout has names of its own.
func TestDefaultLayoutIsLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)

	ddl, err := outbox.Schema("billing.outbox")
	require.NoError(t, err)
	logDDL, err := outbox.LogSchema("billing.outbox")
	require.NoError(t, err)
	require.Equal(t, logDDL, ddl, "Schema is the log layout's")
	rowsDDL, err := outbox.RowsSchema("billing.outbox")
	require.NoError(t, err)
	require.NotEqual(t, logDDL, rowsDDL)
	require.Contains(t, rowsDDL, "published_at  timestamptz")

	newStore := func(t *testing.T, table string, o outbox.Ordering) *outbox.Store {
		t.Helper()
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Ordering: o, Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		return store
	}

	t.Run("CreateSchemaIfAbsent", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, dbtest.Schema(t)+".outbox", outbox.Unordered)
		require.NoError(t, store.CreateSchemaIfAbsent(ctx))
		require.NoError(t, store.CreateSchemaIfAbsent(ctx), "idempotent")
		l, err := store.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.LayoutLog, l)
		requireWorks(t, db, store)
	})

	t.Run("CreateSchemaIfAbsent/ordered", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, dbtest.Schema(t)+".outbox", outbox.OrderedByKey)
		require.NoError(t, store.CreateSchemaIfAbsent(ctx))
		l, err := store.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.LayoutLog, l)
		o, err := store.TableOrdering(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.OrderedByKey, o)
	})

	t.Run("CreateRowsSchemaIfAbsent", func(t *testing.T) {
		t.Parallel()
		table := dbtest.Schema(t) + ".outbox"
		store := newStore(t, table, outbox.Unordered)
		require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
		l, err := store.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.LayoutRows, l)

		// A table that exists keeps its layout: the default function
		// brings it up to date in it (here: makes it ordered).
		ordered := newStore(t, table, outbox.OrderedByKey)
		require.NoError(t, ordered.CreateSchemaIfAbsent(ctx))
		l, err = ordered.Layout(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.LayoutRows, l, "an existing rows table is not touched by the default")
		o, err := ordered.TableOrdering(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.OrderedByKey, o)
		requireWorks(t, db, ordered)
	})
}

// The migration files: the top ones create the log layout and their down
// drops all of it; those under rows/ create the rows layout.
func TestMigrationFilesCreateTheDefaultLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, schema := dbtest.SchemaDB(t)
	run := func(path string) {
		t.Helper()
		sqlText, err := outbox.Migrations.ReadFile(path)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, string(sqlText))
		require.NoError(t, err, path)
	}
	objects := func() int64 {
		return dbtest.Count(t, db, `SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace)
			+ (SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace)`, schema)
	}
	layout := func() outbox.Layout {
		t.Helper()
		store, err := outbox.NewStore(db, &outbox.StoreConfig{Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		l, err := store.Layout(ctx)
		require.NoError(t, err)
		requireWorks(t, db, store)
		return l
	}

	run("migrations/000001_create_outbox.up.sql")
	run("migrations/000001_create_outbox.up.sql") // idempotent
	run("migrations/000002_scheduled.up.sql")
	run("migrations/000002_scheduled.up.sql")
	require.Equal(t, outbox.LayoutLog, layout())
	run("migrations/000002_scheduled.down.sql")
	run("migrations/000001_create_outbox.down.sql")
	require.Zero(t, objects(), "the down migrations drop everything the up ones created")

	run("migrations/rows/000001_create_outbox.up.sql")
	run("migrations/rows/000002_order.up.sql")
	run("migrations/rows/000003_scheduled.up.sql")
	require.Equal(t, outbox.LayoutRows, layout())
	run("migrations/rows/000003_scheduled.down.sql")
	run("migrations/rows/000002_order.down.sql")
	run("migrations/rows/000001_create_outbox.down.sql")
	require.Zero(t, objects())
}

// DropSchema drops everything an ordered table of either layout has beside
// it, the functions of its triggers included (the order trigger's was left
// behind).
func TestDropSchemaLeavesNothingOfAnOrderedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, schema := dbtest.SchemaDB(t)
	objects := func() int64 {
		return dbtest.Count(t, db, `SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace)
			+ (SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace)`, schema)
	}
	for layout, order := range map[string]func(string) (string, error){"rows": outbox.OrderSchema, "log": outbox.LogOrderSchema} {
		ddl := outbox.RowsSchema
		if layout == "log" {
			ddl = outbox.LogSchema
		}
		create, err := ddl("outbox")
		require.NoError(t, err)
		ordered, err := order("outbox")
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, create+ordered)
		require.NoError(t, err, layout)
		require.Positive(t, objects())
		drop, err := outbox.DropSchema("outbox")
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, drop)
		require.NoError(t, err, layout)
		require.Zero(t, objects(), "%s: DropSchema leaves nothing behind", layout)
	}
}
