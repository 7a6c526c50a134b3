package inbox

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite migrations/ from Schema")

// TestMigrationsMatchSchema keeps migrations/ equal to Schema and
// DropSchema; -update rewrites them.
func TestMigrationsMatchSchema(t *testing.T) {
	t.Parallel()
	up, err := Schema(TableDefault)
	require.NoError(t, err)
	down, err := DropSchema(TableDefault)
	require.NoError(t, err)
	const head = "-- The inbox table of github.com/acemq/outbox/inbox (table \"inbox\").\n-- Generated from inbox.Schema; `outbox inbox schema --table NAME` prints it for another name.\n\n"
	myUp, err := MySQLSchema(TableDefault)
	require.NoError(t, err)
	const myHead = "-- The inbox table of github.com/acemq/outbox/inbox (table \"inbox\") on MySQL and MariaDB.\n-- Generated from inbox.MySQLSchema; `outbox inbox schema --database-url mysql://... --table NAME` prints it for another name.\n\n"
	myDown := "DROP TABLE IF EXISTS `inbox`;\n"
	for path, want := range map[string]string{
		"migrations/mysql/000001_create_inbox.up.sql":   myHead + myUp,
		"migrations/mysql/000001_create_inbox.down.sql": myHead + myDown,
		"migrations/mysql/goose/000001_create_inbox.sql": myHead + "-- +goose Up\n" + myUp +
			"\n-- +goose Down\n" + myDown,
		"migrations/000001_create_inbox.up.sql":   head + up,
		"migrations/000001_create_inbox.down.sql": head + down,
		"migrations/goose/000001_create_inbox.sql": head + "-- +goose Up\n-- +goose StatementBegin\n" + up +
			"-- +goose StatementEnd\n\n-- +goose Down\n" + down,
	} {
		if *update {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
			continue
		}
		got, err := Migrations.ReadFile(path)
		require.NoError(t, err, "migration file missing: run go test ./inbox -run TestMigrationsMatchSchema -update")
		require.Equal(t, want, string(got), "%s differs from inbox.Schema: run go test ./inbox -run TestMigrationsMatchSchema -update", path)
	}
}
