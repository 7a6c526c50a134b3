package inbox

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Issue 40: the inbox reads a database error by its kind (package dberr),
// the same way on PostgreSQL and MySQL: a failure of the server or of the
// connection counts no attempt, a value the server refuses is the
// message's, and what an operator must fix comes with advice.
func TestErrorsReadByTheirKind(t *testing.T) {
	for _, c := range []struct {
		err            error
		infrastructure bool
		message        bool
		advice         string
	}{
		{&pgconn.PgError{Code: "57P01"}, true, false, ""},
		{&mysql.MySQLError{Number: 1927}, true, false, ""},
		{&pgconn.PgError{Code: "08006"}, true, false, ""},
		{&mysql.MySQLError{Number: 1040}, true, false, ""},
		{&pgconn.PgError{Code: "42P01"}, true, false, "does not exist"},
		{&mysql.MySQLError{Number: 1146}, true, false, "does not exist"},
		{&pgconn.PgError{Code: "28P01"}, true, false, "PostgreSQL refused the credentials"},
		{&mysql.MySQLError{Number: 1045}, true, false, "MySQL refused the credentials"},
		{&pgconn.PgError{Code: "25006"}, true, false, "read-only"},
		{&mysql.MySQLError{Number: 1290}, true, false, "read-only"},
		{&pgconn.PgError{Code: "22001"}, false, true, ""},
		{&mysql.MySQLError{Number: 1406, SQLState: [5]byte{'2', '2', '0', '0', '1'}}, false, true, ""},
		{&pgconn.PgError{Code: "23514"}, false, false, ""}, // a check the handler's own write broke: the handler's
		{io.ErrUnexpectedEOF, true, false, ""},
		{errors.New("card declined"), false, false, ""},
	} {
		err := fmt.Errorf("charging: %w", c.err)
		require.Equal(t, c.infrastructure, infrastructure(err), "infrastructure(%v)", err)
		require.Equal(t, c.message, messageFault(err), "messageFault(%v)", err)
		if c.advice == "" {
			require.Empty(t, advice(err), "advice(%v)", err)
		} else {
			require.Contains(t, advice(err), c.advice, "advice(%v)", err)
		}
	}
}
