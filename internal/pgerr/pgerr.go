// Package pgerr reads PostgreSQL's error codes from whatever driver made
// the error: pgx's *pgconn.PgError and lib/pq's *pq.Error both have a
// SQLState method.
package pgerr

import (
	"errors"
	"reflect"
)

// State returns the SQLSTATE of the first error in err's chain that has
// one, or "".
func State(err error) string {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}

// Detail returns the DETAIL of the first error in err's chain that has a
// SQLSTATE, or "": pgx's *pgconn.PgError and lib/pq's *pq.Error both keep
// it in a string field named Detail.
func Detail(err error) string {
	for err != nil {
		if _, ok := err.(interface{ SQLState() string }); ok {
			v := reflect.ValueOf(err)
			if v.Kind() == reflect.Pointer && !v.IsNil() {
				v = v.Elem()
			}
			if v.Kind() == reflect.Struct {
				if f := v.FieldByName("Detail"); f.IsValid() && f.Kind() == reflect.String {
					return f.String()
				}
			}
			return ""
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if d := Detail(e); d != "" {
					return d
				}
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}
