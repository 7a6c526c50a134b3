package outbox

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite migrations/ from Schema")

// expectedMigrations derives every migration file from the one DDL in
// schema.go, so the files cannot drift from what CreateSchemaIfAbsent does.
func expectedMigrations(t *testing.T) map[string]string {
	t.Helper()
	tbl, err := parseTable(TableDefault)
	require.NoError(t, err)
	down, err := DropSchema(TableDefault)
	require.NoError(t, err)
	const head = "-- The outbox table of github.com/acemq/outbox (table \"outbox\").\n-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.\n\n"
	goose := func(up, down string) string {
		return head + "-- +goose Up\n-- +goose StatementBegin\n" + up + "-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + down + "-- +goose StatementEnd\n"
	}
	return map[string]string{
		"migrations/000001_create_outbox.up.sql":    head + tbl.createSQL(),
		"migrations/000001_create_outbox.down.sql":  head + down,
		"migrations/000002_order.up.sql":            head + tbl.orderSQL(),
		"migrations/000002_order.down.sql":          head + tbl.dropOrderSQL(),
		"migrations/goose/000001_create_outbox.sql": head + "-- +goose Up\n-- +goose StatementBegin\n" + tbl.createSQL() + "-- +goose StatementEnd\n\n-- +goose Down\n" + down,
		"migrations/goose/000002_order.sql":         goose(tbl.orderSQL(), tbl.dropOrderSQL()),
	}
}

func TestMigrationsMatchSchema(t *testing.T) {
	t.Parallel()
	for path, want := range expectedMigrations(t) {
		if *update {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
		}
		got, err := Migrations.ReadFile(path)
		if *update {
			continue // the embedded copy is the old one until the next build
		}
		require.NoError(t, err, "migration file missing: run go test -run TestMigrationsMatchSchema -update")
		require.Equal(t, want, string(got), "%s differs from outbox.Schema: run go test -run TestMigrationsMatchSchema -update", path)
	}
}
