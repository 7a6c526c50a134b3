package inboxgorm_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/inbox/inboxgorm"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Shipment records its events for the outbox.
type Shipment struct {
	ID      uint
	OrderID string
	outbox.Recorder
}

// Issue 12, item 4: consume → update → publish is one atomic step: the
// handler's GORM write and the event it records commit with the inbox's
// record, or roll back with it.
func TestConsumeUpdatePublishAtomically(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sch := dbtest.Schema(t)
	sqlDB := dbtest.DB(t)
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.NoError(t, gdb.Use(&gormoutbox.Plugin{Table: sch + ".outbox"}))
	store, err := outbox.NewStore(sqlDB, &outbox.StoreConfig{Table: sch + ".outbox"})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	require.NoError(t, gdb.Table(sch+".shipments").AutoMigrate(&Shipment{}))
	ib, err := inbox.New(sqlDB, &inbox.Config{Consumer: "shipping", Table: sch + ".inbox", MaxAttempts: 2})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))

	ch, queue, deliveries := amqptest.ManualQueue(t, "orders")
	publish := func(id string) *amqp.Delivery {
		require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(id)}))
		d := <-deliveries
		return &d
	}

	ship := func(fail bool) inbox.Handler {
		return func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
			s := &Shipment{OrderID: string(d.Body)}
			s.Record(outbox.Event{Type: "shipment.created", Key: s.OrderID})
			if err := inboxgorm.Tx(gdb.WithContext(ctx), tx).Table(sch + ".shipments").Create(s).Error; err != nil {
				return err
			}
			if fail {
				return errors.New("carrier refused")
			}
			return nil
		}
	}
	count := func(q string) int64 { return dbtest.Count(t, sqlDB, q) }

	o, err := ib.Handle(ctx, publish("order-1"), ship(true))
	require.Equal(t, inbox.Retried, o)
	require.ErrorContains(t, err, "carrier refused")
	require.Zero(t, count(`SELECT count(*) FROM `+sch+`.shipments`), "the failed handler's write rolled back")
	require.Zero(t, count(`SELECT count(*) FROM `+sch+`.outbox`), "and its event with it")

	redelivered := <-deliveries
	o, err = ib.Handle(ctx, &redelivered, ship(false))
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	require.EqualValues(t, 1, count(`SELECT count(*) FROM `+sch+`.shipments`))
	require.EqualValues(t, 1, count(`SELECT count(*) FROM `+sch+`.outbox WHERE event_type = 'shipment.created' AND event_key = 'order-1'`),
		"the event was written in the inbox's transaction")
}
