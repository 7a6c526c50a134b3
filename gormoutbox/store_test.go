package gormoutbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
)

// Issue 19: one outbox.Store, configured once, is what the plugin writes
// through when given; the shorthand fields beside it are refused.
func TestPluginWritesThroughASharedStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sqlDB := dbtest.DB(t)
	table := dbtest.Table(t)
	store, err := outbox.NewStore(sqlDB, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange("shop"), Ordering: outbox.OrderedByKey})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.NoError(t, db.Use(&gormoutbox.Plugin{Store: store}))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return gormoutbox.Publish(tx, outbox.Event{Type: "order.placed", Key: "order-1"})
	}))
	outboxtest.RequireEvent(t, sqlDB, table, outboxtest.Match{Type: "order.placed", Exchange: "shop"})

	other, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	err = other.Use(&gormoutbox.Plugin{Store: store, Table: "elsewhere"})
	require.ErrorContains(t, err, "Plugin.Store is set: leave Table, Router, Headers and Ordering empty")
}
