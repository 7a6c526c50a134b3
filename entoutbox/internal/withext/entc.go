//go:build ignore

// Generates the withext test project with the entcext extension.
package main

import (
	"log"

	"entgo.io/ent/entc"
	"entgo.io/ent/entc/gen"

	"github.com/acemq/outbox/entoutbox/entcext"
)

func main() {
	if err := entc.Generate("./schema", &gen.Config{}, entc.Extensions(entcext.Extension{})); err != nil {
		log.Fatal(err)
	}
}
