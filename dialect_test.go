package outbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// Issue 38, item 4: a *sql.DB of MySQL's driver is refused at once, with
// what is supported; PostgreSQL's are not.
func TestNewStoreRefusesMySQL(t *testing.T) {
	t.Parallel()
	db := mysqltest.DB(t)
	require.NoError(t, db.Ping(), "a real MySQL/MariaDB")
	_, err := outbox.NewStore(db, nil)
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.EqualError(t, err, `outbox: NewStore: unsupported database: the database is MySQL or MariaDB (the *sql.DB's driver speaks "mysql"): PostgreSQL is supported, MySQL and MariaDB are not yet`)
	_, err = outbox.NewStore(dbtest.DB(t), nil)
	require.NoError(t, err)
}
