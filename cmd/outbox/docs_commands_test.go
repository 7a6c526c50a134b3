package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docCommand is an `outbox …` command line shown in a code block of a
// document.
type docCommand struct {
	doc  string
	line int
	args []string // after "outbox"
}

// shellWords splits a command line as a shell would, roughly: quotes group,
// an unquoted # starts a comment, and an operator (|, ||, &&, ;, >) ends
// the command.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flush()
		case r == '#' && !inWord:
			flush()
			return words
		case (r == '|' || r == ';' || r == '>' || r == '&') && !inWord:
			flush()
			return words
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return words
}

var envAssignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// docCommands returns the outbox commands in the code blocks (fenced, or
// indented after a blank line) of README.md, BENCHMARKS.md and docs/*.md.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	root := filepath.Join("..", "..")
	docs := []string{"README.md", "BENCHMARKS.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, _ := filepath.Rel(root, m)
		docs = append(docs, rel)
	}
	var cmds []docCommand
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatalf("reading %s: %v", doc, err)
		}
		lines := strings.Split(string(b), "\n")
		inFence, inIndent, prevBlank := false, false, true
		for i, l := range lines {
			code := ""
			switch {
			case strings.HasPrefix(strings.TrimSpace(l), "```"):
				inFence = !inFence
			case inFence:
				code = l
			case strings.HasPrefix(l, "    ") && (prevBlank || inIndent):
				inIndent, code = true, l
			case strings.TrimSpace(l) != "":
				inIndent = false
			}
			prevBlank = strings.TrimSpace(l) == ""
			words := shellWords(strings.TrimPrefix(strings.TrimSpace(code), "$ "))
			for len(words) > 0 && envAssignment.MatchString(words[0]) {
				words = words[1:] // DATABASE_URL=… outbox relay
			}
			if len(words) > 1 && words[0] == "outbox" {
				cmds = append(cmds, docCommand{doc: doc, line: i + 1, args: words[1:]})
			}
		}
	}
	return cmds
}

// helpFlags returns the flags that `outbox <sub> -h` lists (run in this
// process: help is printed before anything connects).
func helpFlags(t *testing.T, sub ...string) (map[string]bool, bool) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append(append([]string{}, sub...), "-h"), &stdout, &stderr, func(string) string { return "" })
	if code != 0 {
		return nil, false
	}
	flags := map[string]bool{"h": true, "help": true}
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(stdout.String(), -1) {
		flags[m[1]] = true
	}
	return flags, true
}

// TestDocsCommandsParse checks every `outbox …` command the documents show
// in a code block: its command (and the inbox's subcommand) exists, and
// every flag it gives is one that command defines.
func TestDocsCommandsParse(t *testing.T) {
	t.Parallel()
	cmds := docCommands(t)
	if len(cmds) < 20 {
		t.Fatalf("found only %d outbox commands in the documents: is the extraction broken?", len(cmds))
	}
	known := map[string]map[string]bool{}
	for _, c := range cmds {
		sub := c.args[:1]
		switch {
		case sub[0] == "help" || sub[0] == "--version" || sub[0] == "-version":
			continue
		case sub[0] == "inbox" && len(c.args) > 1 && !strings.HasPrefix(c.args[1], "-"):
			sub = c.args[:2]
		}
		name := strings.Join(sub, " ")
		if _, ok := commands[sub[0]]; !ok {
			t.Errorf("%s:%d: outbox %s: no such command", c.doc, c.line, name)
			continue
		}
		flags, ok := known[name]
		if !ok {
			if flags, ok = helpFlags(t, sub...); !ok {
				t.Errorf("%s:%d: outbox %s: no such command (its -h failed)", c.doc, c.line, name)
				continue
			}
			known[name] = flags
		}
		for _, a := range c.args[len(sub):] {
			if a == "--" {
				break
			}
			a = strings.Trim(a, "[]")
			if !strings.HasPrefix(a, "-") || a == "-" {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !flags[f] {
				t.Errorf("%s:%d: outbox %s: flag --%s is not defined (outbox %s -h)", c.doc, c.line, name, f, name)
			}
		}
	}
	t.Logf("%d outbox commands checked, of %d commands", len(cmds), len(known))
}
