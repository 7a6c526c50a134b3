package pgrows

import (
	"regexp"
	"testing"
)

// Every statement of both modes has its placeholders filled in: one left
// ({table} misspelt, say) would fail only when the statement runs.
func TestStatementsHaveNoPlaceholderLeft(t *testing.T) {
	placeholder := regexp.MustCompile(`\{[a-z][a-z_]*\}`)
	b := New(Table{Quoted: `"app"."events_outbox"`, OrderedNow: "true"})
	for _, ordered := range []bool{false, true} {
		texts := b.Texts(ordered)
		if len(texts) < 16 {
			t.Fatalf("ordered=%v: %d statements, want 16", ordered, len(texts))
		}
		for what, text := range texts {
			if text == "" {
				t.Errorf("ordered=%v: %s is empty", ordered, what)
			}
			if left := placeholder.FindAllString(text, -1); len(left) > 0 {
				t.Errorf("ordered=%v: %s holds %v, which nothing filled in:\n%s", ordered, what, left, text)
			}
		}
	}
}
