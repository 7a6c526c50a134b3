// Package dialect tells the databases the library supports (PostgreSQL)
// from those it does not, so that each entry point refuses the others at
// once, with an error that says so, rather than at the first write with a
// syntax error.
package dialect

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// ErrUnsupported is outbox.ErrUnsupportedDatabase.
var ErrUnsupported = errors.New("unsupported database")

// Check returns nil when name, a GORM dialector's or ent's dialect name, is
// PostgreSQL's, or is empty (not known), and otherwise an error wrapping
// ErrUnsupported that says what is supported. who names the caller
// ("gormoutbox: Plugin.Initialize") and what (`GORM dialector "mysql"`).
func Check(who, what, name string) error {
	switch strings.ToLower(name) {
	case "", "postgres", "postgresql", "pgx":
		return nil
	case "mysql", "mariadb":
		return fmt.Errorf("%s: %w: the database is MySQL or MariaDB (%s %q): PostgreSQL is supported, MySQL and MariaDB are not yet", who, ErrUnsupported, what, name)
	}
	return fmt.Errorf("%s: %w: %s %q is not PostgreSQL, the only database supported", who, ErrUnsupported, what, name)
}

// drivers maps the packages of database/sql drivers that are known not to
// be PostgreSQL's to the dialect they speak.
var drivers = map[string]string{
	"github.com/go-sql-driver/mysql":   "mysql",
	"github.com/mattn/go-sqlite3":      "sqlite",
	"modernc.org/sqlite":               "sqlite",
	"github.com/microsoft/go-mssqldb":  "sqlserver",
	"github.com/denisenkom/go-mssqldb": "sqlserver",
}

// OfDriver returns the dialect of a database/sql driver (a *sql.DB's
// Driver()) known not to be PostgreSQL's, and "" for every other one
// (pgx, lib/pq, wrappers): only drivers it can tell are refused.
func OfDriver(d any) string {
	t := reflect.TypeOf(d)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return drivers[t.PkgPath()]
}

// OfEnt returns the dialect of the ent driver behind v, a generated
// mutation or transaction, or "" when it cannot be told. ent keeps the
// driver in unexported fields (config.driver, a transaction's drv, a
// debug driver's embedded Driver, and entsql.Driver's dialect): they are
// only read, never called or changed.
func OfEnt(v any) string {
	return entDialect(reflect.ValueOf(v), 0)
}

func entDialect(v reflect.Value, depth int) string {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if !v.IsValid() || v.Kind() != reflect.Struct || depth > 8 {
		return ""
	}
	if f := v.FieldByName("dialect"); f.IsValid() && f.Kind() == reflect.String {
		return f.String()
	}
	for _, name := range []string{"config", "driver", "drv", "Driver"} {
		if f := v.FieldByName(name); f.IsValid() {
			if d := entDialect(f, depth+1); d != "" {
				return d
			}
		}
	}
	return ""
}
