// Package examples_test runs the examples as a user would and checks their
// summary lines.
package examples_test

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExamples(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"gorm", "ent"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command("go", "run", "./"+name).CombinedOutput()
			require.NoError(t, err, "go run ./examples/%s:\n%s", name, out)
			require.Regexp(t, `(?m)^placed 100 orders \(10 rolled back\): 90 events published, 90 received, 0 lost$`, string(out))
			require.Regexp(t, `(?m)^consumer \(inbox\): 90 effects applied, 0 of them more than once$`, string(out))
		})
	}
}
