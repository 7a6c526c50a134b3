package relay_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/relay"
)

// The advice for an error waiting will not fix comes from what the error
// means, whichever database said it (issue 40: the relay reads no
// driver's codes itself); a read-only node is one of them (issue 45).
func TestAdviceOfEitherDatabase(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("outbox: claiming from outbox: %w", err) }
	for _, c := range []struct {
		err  error
		want string
	}{
		{&pgconn.PgError{Code: "42P01"}, "the outbox table does not exist"},
		{&mysql.MySQLError{Number: 1146}, "the outbox table does not exist"},
		{&pgconn.PgError{Code: "28P01"}, "PostgreSQL refused the credentials"},
		{&mysql.MySQLError{Number: 1045}, "MySQL refused the credentials"},
		{&pgconn.PgError{Code: "25006"}, "accepts no writes"},
		{&mysql.MySQLError{Number: 1290}, "accepts no writes"},
	} {
		require.Contains(t, relay.Advice(wrap(c.err)), c.want, "%v", c.err)
	}
	for _, err := range []error{&pgconn.PgError{Code: "57P01"}, &mysql.MySQLError{Number: 1213}, errors.New("i/o timeout")} {
		require.Empty(t, relay.Advice(wrap(err)), "%v: retrying cures it", err)
	}
}
