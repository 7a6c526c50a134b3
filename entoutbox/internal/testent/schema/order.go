// Package schema is the test schema of entoutbox.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is an order of the test shop.
type Order struct{ ent.Schema }

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("status").Default("new"),
		field.Int("total").Default(0),
	}
}
