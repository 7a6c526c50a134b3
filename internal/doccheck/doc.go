// Package doccheck holds the tests that keep the repository's Markdown
// documents honest: TestDocsLinksResolve checks that every relative link in
// README.md, BENCHMARKS.md, CHANGELOG.md and docs/ leads to a file that
// exists, and to a heading of it when the link names one. (The commands the
// documents show are checked against the CLI's flags by cmd/outbox's
// TestDocsCommandsParse.) It has no code of its own and needs no server.
package doccheck
