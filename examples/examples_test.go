// Package examples_test runs the examples as a user would and checks their
// summary lines.
package examples_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/mysqltest"
)

func TestExamples(t *testing.T) {
	t.Parallel()
	mysql := os.Getenv("TEST_MYSQL_DSN")
	if mysql == "" {
		mysql = mysqltest.DSNDefault
	}
	for _, c := range []struct{ name, example, databaseURL string }{
		{"gorm", "gorm", ""}, {"ent", "ent", ""},
		// Issue 41: the same examples on MariaDB.
		{"gorm-mysql", "gorm", mysql}, {"ent-mysql", "ent", mysql},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "run", "./"+c.example)
			if c.databaseURL != "" {
				cmd.Env = append(os.Environ(), "DATABASE_URL="+c.databaseURL)
			}
			name := c.example
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "go run ./examples/%s:\n%s", name, out)
			require.Regexp(t, `(?m)^placed 100 orders \(10 rolled back\): 90 events published, 90 received, 0 lost$`, string(out))
			require.Regexp(t, `(?m)^consumer \(inbox\): 90 effects applied, 0 of them more than once$`, string(out))
		})
	}
}
