package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Customer is a customer of the test shop; no rule matches it.
type Customer struct{ ent.Schema }

// Fields of the Customer.
func (Customer) Fields() []ent.Field {
	return []ent.Field{field.String("name")}
}
