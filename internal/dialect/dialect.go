// Package dialect tells the databases the library supports (PostgreSQL,
// MySQL and MariaDB) from those it does not, so that each entry point
// refuses the others at once, with an error that says so, rather than at
// the first write with a syntax error, and knows which of its own it has.
package dialect

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// ErrUnsupported is outbox.ErrUnsupportedDatabase.
var ErrUnsupported = errors.New("unsupported database")

// The databases Check tells apart.
const (
	Unknown  = ""         // not told (an empty name): taken as PostgreSQL by the callers
	Postgres = "postgres" // PostgreSQL
	MySQL    = "mysql"    // MySQL or MariaDB
)

// Check returns which supported database name, a GORM dialector's or
// ent's dialect name or a driver's (OfDriver), is: Postgres, MySQL, or
// Unknown for an empty name; for any other, an error wrapping
// ErrUnsupported that says what is supported. who names the caller
// ("gormoutbox: Plugin.Initialize") and what (`GORM dialector "sqlite"`).
func Check(who, what, name string) (string, error) {
	switch strings.ToLower(name) {
	case "":
		return Unknown, nil
	case "postgres", "postgresql", "pgx":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	}
	return "", fmt.Errorf("%s: %w: %s %q is not PostgreSQL, MySQL or MariaDB, the databases supported", who, ErrUnsupported, what, name)
}

// Same returns nil when spoken, Check's answer, is Unknown or the
// database a store keeps its table in (MySQL when mysql, else Postgres),
// and an error that says they differ otherwise.
func Same(who, what, spoken string, mysql bool) error {
	want, name := Postgres, "PostgreSQL"
	if mysql {
		want, name = MySQL, "MySQL"
	}
	if spoken == Unknown || spoken == want {
		return nil
	}
	return fmt.Errorf("%s: the outbox store's database is %s, and the %s is %q: configure the store with the database it writes to (outbox.StoreConfig.Database)", who, name, what, spoken)
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
