package gormoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/mysqltest"
)

// Issue 41: GORM on MySQL or MariaDB (gorm.io/driver/mysql). The plugin
// writes a model's events in the transaction of its change: a committed
// Create publishes them, one rolled back leaves neither the row nor the
// events; a relay's store on the same database claims them.
func TestPluginOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := gorm.Open(mysql.Open(mysqltest.DSN(t)), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB.Close() })
	var version string
	require.NoError(t, db.Raw("SELECT VERSION()").Scan(&version).Error)
	t.Logf("server: %s", version)

	relayStore, err := outbox.NewStore(sqlDB, nil)
	require.NoError(t, err)
	require.Equal(t, outbox.MySQL, relayStore.Database())
	require.NoError(t, relayStore.CreateSchemaIfAbsent(ctx))
	require.NoError(t, db.Use(&gormoutbox.Plugin{}))
	require.NoError(t, db.AutoMigrate(&Order{}, &Line{}))

	o := &Order{Status: "placed", Total: 42}
	o.Record(outbox.Event{Type: "order.placed", Key: "order-42", Payload: []byte(`{"total":42}`)})
	require.NoError(t, db.Create(o).Error)

	boom := errors.New("boom")
	err = db.Transaction(func(tx *gorm.DB) error {
		r := &Order{Status: "rolled back"}
		r.Record(outbox.Event{Type: "order.placed", Key: "never"})
		if err := tx.Create(r).Error; err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)

	var orders int64
	require.NoError(t, db.Model(&Order{}).Count(&orders).Error)
	require.EqualValues(t, 1, orders)
	msgs, err := relayStore.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "the rolled-back order's event is not there")
	require.Equal(t, "order.placed", msgs[0].EventType)
	require.Equal(t, "order-42", msgs[0].Key)
	require.JSONEq(t, `{"total":42}`, string(msgs[0].Payload))
	require.NoError(t, relayStore.MarkPublished(ctx, msgs...))

	// A store of the other database is refused before anything is
	// registered.
	pg, err := outbox.NewStore(nil, nil)
	require.NoError(t, err)
	db2, err := gorm.Open(mysql.Open(mysqltest.DSN(t)), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sql2, err := db2.DB()
	require.NoError(t, err)
	t.Cleanup(func() { sql2.Close() })
	err = db2.Use(&gormoutbox.Plugin{Store: pg})
	require.EqualError(t, err, `gormoutbox: Plugin.Initialize: the outbox store's database is PostgreSQL, and the GORM dialector is "mysql": configure the store with the database it writes to (outbox.StoreConfig.Database)`)
	require.Nil(t, db2.Callback().Create().Get("gormoutbox:capture_create"), "no callback registered")
}
