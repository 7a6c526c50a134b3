// Package textcut cuts text to fit a column or a log line without breaking
// a character.
package textcut

import "strings"

// Cut returns s, made valid UTF-8, cut to at most n bytes, never inside a
// character, with "…" added when something was cut.
func Cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
