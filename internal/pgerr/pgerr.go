// Package pgerr reads PostgreSQL's error codes from whatever driver made
// the error: pgx's *pgconn.PgError and lib/pq's *pq.Error both have a
// SQLState method.
package pgerr

import "errors"

// State returns the SQLSTATE of the first error in err's chain that has
// one, or "".
func State(err error) string {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState()
	}
	return ""
}
