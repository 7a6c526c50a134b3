// Package schema is the schema of the withext test project.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is an order.
type Order struct{ ent.Schema }

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{field.Int("total").Default(0)}
}
