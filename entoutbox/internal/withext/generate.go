// Package withext is an ent project generated with the entcext extension,
// to test the helpers it generates.
package withext

// GOMAXPROCS=1: see ../gen.go.
//
//go:generate env GOMAXPROCS=1 go run -mod=mod entc.go
