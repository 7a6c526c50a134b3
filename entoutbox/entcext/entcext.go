// Package entcext is an optional entc extension for entoutbox. It turns on
// the sql/execquery feature the hook needs, adds an Outbox option to the
// generated client, and generates typed helpers:
//
//	client := ent.NewClient(ent.Driver(drv), ent.Outbox(ob))
//	client.UseOutbox()                 // client.Use(entoutbox.Hook[*ent.Tx](ob))
//	err := tx.Publish(ctx, evts...)    // ob.Publish(ctx, tx, evts...)
//
// Use it from an entc.go run by go generate:
//
//	//go:build ignore
//
//	func main() {
//		err := entc.Generate("./schema", &gen.Config{}, entc.Extensions(entcext.Extension{}))
//		...
//	}
//
// The extension is sugar: generating with `--feature sql/execquery` and
// registering entoutbox.Hook yourself does the same.
package entcext

import (
	_ "embed"

	"entgo.io/ent/entc"
	"entgo.io/ent/entc/gen"

	"github.com/acemq/outbox/entoutbox"
)

//go:embed entoutbox.tmpl
var tmpl string

// Extension is the entc extension. Its zero value is ready to use.
type Extension struct {
	entc.DefaultExtension
}

var _ entc.Extension = Extension{}

// Options turns on sql/execquery and adds the Outbox dependency.
func (Extension) Options() []entc.Option {
	return []entc.Option{
		entc.FeatureNames(gen.FeatureExecQuery.Name),
		entc.Dependency(entc.DependencyName("Outbox"), entc.DependencyType(&entoutbox.Outbox{})),
	}
}

// Templates generates entoutbox.go with OutboxHook, Client.UseOutbox and
// Tx.Publish.
func (Extension) Templates() []*gen.Template {
	return []*gen.Template{gen.MustParse(gen.NewTemplate("entoutbox").Parse(tmpl))}
}
