package textcut

import (
	"testing"
	"unicode/utf8"
)

// Cutting never breaks a character, and invalid bytes are replaced.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"héllo", 2, "h…"}, // é is two bytes: not cut in half
		{"héllo", 3, "hé…"},
		{"a\xffb", 10, "a\uFFFDb"},
	} {
		got := Cut(tc.in, tc.n)
		if got != tc.want || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
