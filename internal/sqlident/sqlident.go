// Package sqlident validates and quotes the table names of the module's
// tables (the outbox's and the inbox's), so that a name can never change
// the meaning of the SQL it is placed in.
package sqlident

import (
	"fmt"
	"strings"
)

// NameMax is the longest table (or schema) name accepted: PostgreSQL
// identifiers are cut at 63 bytes, and index names append a suffix of up
// to 14 characters to the table name.
const NameMax = 48

// Table is a validated table name.
type Table struct {
	Quoted string // "schema"."name" or "name", safe to splice into SQL
	Name   string // the unqualified name, for index names
}

// ParseTable validates a table name: one or two dot-separated parts (schema
// and table), each a lowercase SQL identifier of at most 48 characters.
// Its error starts with the name and says what is wrong with it.
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("%q: at most one dot is allowed (schema.table)", s)
	}
	quoted := make([]string, len(parts))
	for i, p := range parts {
		if err := checkIdent(p); err != nil {
			return Table{}, fmt.Errorf("%q: %s", shorten(s, 80), err)
		}
		quoted[i] = `"` + p + `"`
	}
	return Table{Quoted: strings.Join(quoted, "."), Name: parts[len(parts)-1]}, nil
}

func checkIdent(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("a part of the name is empty")
	case len(p) > NameMax:
		return fmt.Errorf("%q is %d characters long, the limit is %d", shorten(p, 20), len(p), NameMax)
	case p[0] >= '0' && p[0] <= '9':
		return fmt.Errorf("%q starts with a digit", p)
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("character %q is not allowed: use lowercase letters, digits and underscores", c)
		}
	}
	return nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
