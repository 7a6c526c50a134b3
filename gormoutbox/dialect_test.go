package gormoutbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/mysqltest"
)

// Issue 38, item 4: on MySQL or MariaDB, db.Use returned nil and the first
// Create failed with "Error 1064 … near '"outbox" (id, …'". The plugin
// refuses the database at once, says what is supported, and registers
// nothing.
func TestPluginRefusesMySQL(t *testing.T) {
	t.Parallel()
	db, err := gorm.Open(mysql.Open(mysqltest.DSN(t)), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB.Close() })
	var version string
	require.NoError(t, db.Raw("SELECT VERSION()").Scan(&version).Error)
	t.Logf("server: %s", version)

	err = db.Use(&gormoutbox.Plugin{})
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.EqualError(t, err, `gormoutbox: Plugin.Initialize: unsupported database: the database is MySQL or MariaDB (GORM dialector "mysql"): PostgreSQL is supported, MySQL and MariaDB are not yet`)
	require.Nil(t, db.Callback().Create().Get("gormoutbox:capture_create"), "no callback registered")
	_, registered := db.Config.Plugins[gormoutbox.PluginName]
	require.False(t, registered)

	// The store of a relay on the same database is refused too.
	_, err = outbox.NewStore(sqlDB, nil)
	require.ErrorIs(t, err, outbox.ErrUnsupportedDatabase)
	require.ErrorContains(t, err, "outbox: NewStore: unsupported database: the database is MySQL or MariaDB")
}
