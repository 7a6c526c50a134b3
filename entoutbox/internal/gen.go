// Package internal holds the ent projects entoutbox is tested against:
// testent, generated with the sql/execquery feature the hook needs, and
// noexec, generated without it. Regenerate with `go generate ./entoutbox/...`;
// CI fails if the committed code differs from what this generates.
package internal

//go:generate go run entgo.io/ent/cmd/ent@v0.14.5 generate --feature sql/execquery ./testent/schema
//go:generate go run entgo.io/ent/cmd/ent@v0.14.5 generate ./noexec/schema
