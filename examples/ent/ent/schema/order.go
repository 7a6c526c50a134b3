// Package schema is the example's ent schema.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is an order of the example shop.
type Order struct{ ent.Schema }

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("customer"),
		field.Int("total"),
	}
}
