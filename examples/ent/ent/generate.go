// Package ent is the generated ent code of the example, with the
// sql/execquery feature entoutbox needs.
package ent

// GOMAXPROCS=1: ent formats the generated files in parallel, and that
// sometimes drops the stdsql import of the execquery feature.
//
//go:generate env GOMAXPROCS=1 go run entgo.io/ent/cmd/ent@v0.14.5 generate --feature sql/execquery ./schema
