// Package ent is the generated ent code of the example, with the
// sql/execquery feature entoutbox needs.
package ent

//go:generate go run entgo.io/ent/cmd/ent@v0.14.5 generate --feature sql/execquery ./schema
