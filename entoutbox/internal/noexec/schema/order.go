// Package schema is an ent schema generated without the sql/execquery
// feature, to test the error entoutbox gives for it.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is an order.
type Order struct{ ent.Schema }

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{field.String("status").Default("new")}
}
