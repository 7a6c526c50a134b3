package outbox

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/mysqlstore"
)

var update = flag.Bool("update", false, "rewrite migrations/ from Schema")

// expectedMigrations derives every migration file from the one DDL of each
// layout, so the files cannot drift from what Schema (and
// CreateSchemaIfAbsent) and RowsSchema (CreateRowsSchemaIfAbsent) create:
// the default layout, LayoutLog, at the top, the rows layout under rows/.
func expectedMigrations(t *testing.T) map[string]string {
	t.Helper()
	tbl, err := parseTable(TableDefault)
	require.NoError(t, err)
	// 000001 is the table as it was first released, 000002 (000003 of
	// the rows layout) the table of delayed messages beside it; Schema
	// and RowsSchema are the files in order.
	logUp, down := tbl.logSQL(tbl.logTables()), tbl.dropSQL()
	schedUp, schedDown := tbl.scheduledSQL(), tbl.dropScheduledSQL()
	full, err := Schema(TableDefault)
	require.NoError(t, err)
	require.Equal(t, logUp+"\n"+schedUp, full)
	const logHead = "-- The outbox table of github.com/acemq/outbox (table \"outbox\"), in the log layout: the default.\n-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.\n\n"
	const rowsHead = "-- The outbox table of github.com/acemq/outbox (table \"outbox\"), in the rows layout.\n-- Generated from outbox.RowsSchema; `outbox schema --layout rows --table NAME` prints it for another name.\n\n"
	goose := func(up, down string) string {
		return "-- +goose Up\n-- +goose StatementBegin\n" + up + "-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + down + "-- +goose StatementEnd\n"
	}
	my := newBackend(MySQL, tbl)
	myUp, myDown := mysqlstore.Script(my.SchemaStatements()), mysqlstore.Script(my.DropStatements())
	mySched, mySchedDown := mysqlstore.Script(my.ScheduleStatements()), "DROP TABLE IF EXISTS `outbox_scheduled`;\n"
	const myHead = "-- The outbox table of github.com/acemq/outbox (table \"outbox\") on MySQL and MariaDB, unordered.\n" +
		"-- Generated from outbox.MySQLSchema; `outbox schema --database-url mysql://... --table NAME` prints it for another name,\n" +
		"-- and with --ordered the trigger that makes it an ordered table. golang-migrate runs a file of\n" +
		"-- several statements when the DSN has multiStatements=true.\n\n"
	return map[string]string{
		"migrations/mysql/000001_create_outbox.up.sql":    myHead + myUp,
		"migrations/mysql/000001_create_outbox.down.sql":  myHead + myDown,
		"migrations/mysql/goose/000001_create_outbox.sql": myHead + "-- +goose Up\n" + myUp + "\n-- +goose Down\n" + myDown,
		"migrations/mysql/000002_scheduled.up.sql":        myHead + mySched,
		"migrations/mysql/000002_scheduled.down.sql":      myHead + mySchedDown,
		"migrations/mysql/goose/000002_scheduled.sql":     myHead + "-- +goose Up\n" + mySched + "\n-- +goose Down\n" + mySchedDown,

		"migrations/000001_create_outbox.up.sql":    logHead + logUp,
		"migrations/000001_create_outbox.down.sql":  logHead + down,
		"migrations/goose/000001_create_outbox.sql": logHead + goose(logUp, down),
		"migrations/000002_scheduled.up.sql":        logHead + schedUp,
		"migrations/000002_scheduled.down.sql":      logHead + schedDown,
		"migrations/goose/000002_scheduled.sql":     logHead + goose(schedUp, schedDown),

		"migrations/rows/000001_create_outbox.up.sql":    rowsHead + tbl.createSQL(),
		"migrations/rows/000001_create_outbox.down.sql":  rowsHead + tbl.dropRowsSQL(),
		"migrations/rows/000002_order.up.sql":            rowsHead + tbl.orderSQL(),
		"migrations/rows/000002_order.down.sql":          rowsHead + tbl.dropOrderSQL(),
		"migrations/rows/goose/000001_create_outbox.sql": rowsHead + "-- +goose Up\n-- +goose StatementBegin\n" + tbl.createSQL() + "-- +goose StatementEnd\n\n-- +goose Down\n" + tbl.dropRowsSQL(),
		"migrations/rows/goose/000002_order.sql":         rowsHead + goose(tbl.orderSQL(), tbl.dropOrderSQL()),
		"migrations/rows/000003_scheduled.up.sql":        rowsHead + schedUp,
		"migrations/rows/000003_scheduled.down.sql":      rowsHead + schedDown,
		"migrations/rows/goose/000003_scheduled.sql":     rowsHead + goose(schedUp, schedDown),
	}
}

func TestMigrationsMatchSchema(t *testing.T) {
	t.Parallel()
	want := expectedMigrations(t)
	for path, content := range want {
		if *update {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
		}
		got, err := Migrations.ReadFile(path)
		if *update {
			continue // the embedded copy is the old one until the next build
		}
		require.NoError(t, err, "migration file missing: run go test -run TestMigrationsMatchSchema -update")
		require.Equal(t, content, string(got), "%s differs from outbox.Schema: run go test -run TestMigrationsMatchSchema -update", path)
	}
	// No file is left over from an earlier layout of the directory.
	require.NoError(t, fs.WalkDir(Migrations, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if _, ok := want[path]; !ok {
			if *update {
				return os.Remove(path)
			}
			t.Errorf("%s is not a migration of Schema or RowsSchema: run go test -run TestMigrationsMatchSchema -update", path)
		}
		return nil
	}))
}
