// Package internal holds the ent projects entoutbox is tested against:
// testent, generated with the sql/execquery feature the hook needs, and
// noexec, generated without it. Regenerate with `go generate ./entoutbox/...`;
// CI fails if the committed code differs from what this generates.
package internal

// GOMAXPROCS=1: ent formats the generated files in parallel, and that
// sometimes drops the stdsql import of the execquery feature.
//
//go:generate env GOMAXPROCS=1 go run entgo.io/ent/cmd/ent@v0.14.5 generate --feature sql/execquery ./testent/schema
//go:generate env GOMAXPROCS=1 go run entgo.io/ent/cmd/ent@v0.14.5 generate ./noexec/schema
