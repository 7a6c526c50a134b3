package inboxgorm_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/inbox/inboxgorm"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// Issue 41: on MySQL/MariaDB too, consume → update → publish is one atomic
// step: the handler's GORM write and its event commit with the inbox's
// record or roll back with it, and a redelivery after the commit is a
// duplicate.
func TestConsumeUpdatePublishAtomicallyOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sqlDB := mysqltest.DB(t)
	gdb, err := gorm.Open(mysql.New(mysql.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.NoError(t, gdb.Use(&gormoutbox.Plugin{}))
	store, err := outbox.NewStore(sqlDB, nil)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	require.NoError(t, gdb.AutoMigrate(&Shipment{}))
	ib, err := inbox.New(sqlDB, &inbox.Config{Consumer: "shipping", MaxAttempts: 2})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))

	ch, queue, deliveries := amqptest.ManualQueue(t, "orders-mysql")
	require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: "m-1", Body: []byte("order-1")}))
	ship := func(fail bool) inbox.Handler {
		return func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			s := &Shipment{OrderID: string(d.Body)}
			s.Record(outbox.Event{Type: "shipment.created", Key: s.OrderID})
			if err := inboxgorm.Tx(gdb.WithContext(ctx), tx).Create(s).Error; err != nil {
				return err
			}
			if fail {
				return errors.New("carrier refused")
			}
			return nil
		}
	}
	count := func(q string) int64 { return dbtest.Count(t, sqlDB, q) }

	d := <-deliveries
	o, err := ib.Handle(ctx, &d, ship(true))
	require.Equal(t, inbox.Retried, o)
	require.ErrorContains(t, err, "carrier refused")
	require.Zero(t, count(`SELECT count(*) FROM shipments`), "the failed handler's write rolled back")
	require.Zero(t, count(`SELECT count(*) FROM outbox`), "and its event with it")

	d = <-deliveries
	o, err = ib.Handle(ctx, &d, ship(false))
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.EqualValues(t, 1, count(`SELECT count(*) FROM shipments`))
	require.EqualValues(t, 1, count(`SELECT count(*) FROM outbox WHERE event_type = 'shipment.created' AND event_key = 'order-1'`),
		"the event was written in the inbox's transaction")

	require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: "m-1", Body: []byte("order-1")}))
	d = <-deliveries
	o, err = ib.Handle(ctx, &d, ship(false))
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, o)
	require.EqualValues(t, 1, count(`SELECT count(*) FROM shipments`))
	recs, err := ib.Records(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.Records{Handled: 1}, recs)
}
