package dberr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/dberr"
)

// Each database's errors, wrapped as the store wraps them, are classified
// by the codes their drivers carry; an error of neither is Other.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind dberr.Kind
		db   string
	}{
		{&pgconn.PgError{Code: "42P01"}, dberr.NoTable, "PostgreSQL"},
		{&pgconn.PgError{Code: "28P01"}, dberr.Credentials, "PostgreSQL"},
		{&pgconn.PgError{Code: "3F000"}, dberr.NoSchema, "PostgreSQL"},
		{&pgconn.PgError{Code: "25006"}, dberr.ReadOnly, "PostgreSQL"},
		{&pgconn.PgError{Code: "57P01"}, dberr.Terminated, "PostgreSQL"},
		{&pgconn.PgError{Code: "40P01"}, dberr.Deadlock, "PostgreSQL"},
		{&pgconn.PgError{Code: "22P02"}, dberr.BadData, "PostgreSQL"},
		{&pgconn.PgError{Code: "54000"}, dberr.BadData, "PostgreSQL"},
		{&pgconn.PgError{Code: "08006"}, dberr.Unavailable, "PostgreSQL"},
		{&pgconn.PgError{Code: "53300"}, dberr.Unavailable, "PostgreSQL"},
		{&pgconn.PgError{Code: "57P04"}, dberr.Unavailable, "PostgreSQL"},
		{&pgconn.PgError{Code: "42601"}, dberr.Other, "PostgreSQL"},
		{&mysql.MySQLError{Number: 1040}, dberr.Unavailable, "MySQL"},
		{&mysql.MySQLError{Number: 1406, SQLState: [5]byte{'2', '2', '0', '0', '1'}}, dberr.BadData, "MySQL"},
		{&mysql.MySQLError{Number: 2999, SQLState: [5]byte{'0', '8', 'S', '0', '1'}}, dberr.Unavailable, "MySQL"},
		{&mysql.MySQLError{Number: 1146, Message: "Table 'test.x' doesn't exist"}, dberr.NoTable, "MySQL"},
		{&mysql.MySQLError{Number: 1045}, dberr.Credentials, "MySQL"},
		{&mysql.MySQLError{Number: 1205}, dberr.LockNotAvailable, "MySQL"},
		{&mysql.MySQLError{Number: 1213}, dberr.Deadlock, "MySQL"},
		{&mysql.MySQLError{Number: 1290}, dberr.ReadOnly, "MySQL"},
		{&mysql.MySQLError{Number: 1792}, dberr.ReadOnly, "MySQL"},
		{&mysql.MySQLError{Number: 1062}, dberr.Duplicate, "MySQL"},
		{&mysql.MySQLError{Number: 1064}, dberr.Other, "MySQL"},
		{errors.New("connection refused"), dberr.Other, ""},
		{nil, dberr.Other, ""},
	} {
		err := c.err
		if err != nil {
			err = fmt.Errorf("outbox: claiming from outbox: %w", err)
		}
		require.Equal(t, c.kind, dberr.Classify(err), "%v", err)
		require.Equal(t, c.db, dberr.Database(err), "%v", err)
	}
}
