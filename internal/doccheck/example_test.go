package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's Go blocks that say they come from a tested Example
// ("from [`path`](path), a tested `Example`") must not drift from it:
// every line of such a block is a line of that file (blanks and spaces
// aside), but for the lines an application writes otherwise than a test
// (where the database URL comes from) and the block's closing comment.
var fromExample = regexp.MustCompile("(?s)from \\[`([^`]+)`\\]\\([^)]+\\),\\s*a tested `Example`\\):\\s*```go\\n(.*?)```")

// appOnly are the lines of a README block an Example writes otherwise.
var appOnly = []string{"gorm.Open(postgres.Open(os.Getenv(", "// A relay publishes"}

func TestReadmeExamplesAreTested(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := fromExample.FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("the README shows no block from a tested Example")
	}
	for _, b := range blocks {
		src, err := os.ReadFile(filepath.Join(root, b[1]))
		if err != nil {
			t.Fatalf("the README's example names %s: %v", b[1], err)
		}
		have := map[string]bool{}
		for _, l := range strings.Split(string(src), "\n") {
			have[strings.Join(strings.Fields(l), " ")] = true
		}
		checked := 0
	lines:
		for _, l := range strings.Split(b[2], "\n") {
			l = strings.Join(strings.Fields(l), " ")
			if l == "" {
				continue
			}
			for _, a := range appOnly {
				if strings.Contains(l, a) {
					continue lines
				}
			}
			checked++
			if !have[l] {
				t.Errorf("README's example line %q is not in %s: keep them the same", l, b[1])
			}
		}
		t.Logf("%s: %d lines of the README's example found in it", b[1], checked)
	}
}
