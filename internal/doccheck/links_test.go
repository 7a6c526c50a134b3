package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// documents lists the Markdown files whose links are checked, relative to
// root: the front page, the figures, the changelog and every guide.
func documents(t *testing.T) []string {
	t.Helper()
	docs := []string{"README.md", "BENCHMARKS.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			docs = append(docs, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing docs/: %v", err)
	}
	return docs
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	heading    = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// prose returns the lines of a Markdown document that are not code: fenced
// and indented code blocks are blanked, and code spans removed.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	out := make([]string, len(lines))
	inFence, prevBlank := false, true
	inIndent := false
	for i, l := range lines {
		switch {
		case fence.MatchString(l):
			inFence = !inFence
			l = ""
		case inFence:
			l = ""
		case strings.HasPrefix(l, "    ") || strings.HasPrefix(l, "\t"):
			// An indented code block starts after a blank line and is not
			// a list item's continuation (those are indented by 2 or 3,
			// or follow a list line without a blank).
			if prevBlank || inIndent {
				inIndent = true
				l = ""
			}
		default:
			if strings.TrimSpace(l) != "" {
				inIndent = false
			}
		}
		prevBlank = strings.TrimSpace(lines[i]) == ""
		out[i] = codeSpan.ReplaceAllString(l, "")
	}
	return out
}

// slug is the anchor GitHub gives a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces made '-'.
func slug(h string) string {
	h = codeSpan.ReplaceAllStringFunc(h, func(s string) string { return strings.Trim(s, "`") })
	h = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1") // a link keeps its text
	h = regexp.MustCompile(`<[^>]+>`).ReplaceAllString(h, "")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors a Markdown document defines: one per heading
// (a repeated heading gets -1, -2, … as on GitHub) and any <a name>.
func anchors(text string) map[string]bool {
	set := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(text) {
		if m := heading.FindStringSubmatch(l); m != nil {
			s := slug(m[2])
			if n := seen[s]; n > 0 {
				set[s+"-"+strconv.Itoa(n)] = true
			} else {
				set[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			set[m[1]] = true
		}
	}
	// Headings inside code blocks are blanked by prose; html anchors in
	// the raw text count too.
	for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
		set[m[1]] = true
	}
	return set
}

// links returns the link targets of a document's prose, with their line.
func links(text string) (targets []string, lines []int) {
	for i, l := range prose(text) {
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			targets, lines = append(targets, m[1]), append(lines, i+1)
		}
		if m := refLink.FindStringSubmatch(l); m != nil {
			targets, lines = append(targets, m[1]), append(lines, i+1)
		}
	}
	return targets, lines
}

func external(target string) bool {
	if strings.HasPrefix(target, "//") {
		return true
	}
	if i := strings.Index(target, ":"); i > 0 && !strings.ContainsAny(target[:i], "/#.") {
		return true // a scheme: https:, mailto:, …
	}
	return false
}

// TestDocsLinksResolve checks every relative link of the documents: its
// file exists, and its #anchor, if any, is a heading of the Markdown file
// it names (or of its own document).
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := cache[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		cache[path] = anchors(string(b))
		return cache[path], nil
	}
	checked := 0
	for _, doc := range documents(t) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatalf("reading %s: %v", doc, err)
		}
		targets, lines := links(string(b))
		for i, target := range targets {
			if external(target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			file := filepath.Join(root, doc)
			if path != "" {
				file = filepath.Join(root, filepath.Dir(doc), filepath.FromSlash(path))
			}
			info, err := os.Stat(file)
			if err != nil {
				t.Errorf("%s:%d: link %q: no such file or directory (%s)", doc, lines[i], target, file)
				continue
			}
			if anchor == "" || info.IsDir() || !strings.HasSuffix(file, ".md") {
				continue
			}
			set, err := anchorsOf(file)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", doc, lines[i], target, err)
				continue
			}
			if !set[strings.ToLower(anchor)] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", doc, lines[i], target, filepath.Base(file), anchor)
			}
		}
	}
	t.Logf("%d relative links checked", checked)
}

// TestSlug pins the anchors GitHub gives the headings these documents use.
func TestSlug(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]string{
		"Proving your deployment (outbox verify)": "proving-your-deployment-outbox-verify",
		"Plain database/sql":                      "plain-databasesql",
		"Two layouts: rows or log":                "two-layouts-rows-or-log",
		"Runtime settings of `outbox relay`":      "runtime-settings-of-outbox-relay",
		"MySQL and MariaDB":                       "mysql-and-mariadb",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}
