package service_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
	"github.com/acemq/outbox/service"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestServiceRelaysAndConsumesExactlyOnce runs a service's relay and its
// consumer in one call: every committed event is published and applied
// once, a rolled back one never, a message the broker delivers twice is
// applied once; when the context ends Run returns nil, with nothing left
// claimed.
func TestServiceRelaysAndConsumesExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table, inboxTable := dbtest.Table(t), dbtest.Table(t)
	top := amqptest.Declare(t, amqptest.Conn(t))
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange(top.Exchange)})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	ib, err := inbox.New(db, &inbox.Config{Consumer: "svc", Table: inboxTable})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	effects := dbtest.Table(t)
	_, err = db.ExecContext(ctx, `CREATE TABLE "`+effects+`" (message_id text NOT NULL)`)
	require.NoError(t, err)

	const n = 50
	for i := range n + 1 {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.placed", Key: fmt.Sprint(i)}))
		if i == n {
			require.NoError(t, tx.Rollback()) // never published
			continue
		}
		require.NoError(t, tx.Commit())
	}

	var calls atomic.Int64
	apply := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		calls.Add(1)
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+effects+`" VALUES ($1)`, d.MessageId)
		return err
	}
	svc, err := service.New(&service.Config{
		DB: db, AMQPURLs: []string{amqptest.URL()}, Table: table,
		Inbox:     &inbox.Config{Consumer: "svc", Table: inboxTable},
		Consumers: []*inbox.ConsumerConfig{{Queue: top.Queue, Handler: apply}},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(cancel)

	count := func() int64 {
		return dbtest.Count(t, db, `SELECT count(*) FROM "`+effects+`"`)
	}
	require.Eventually(t, func() bool { return count() == n }, 30*time.Second, 10*time.Millisecond)

	// The broker delivers one of them again: acked, no second effect.
	var id string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT min(message_id) FROM "`+effects+`"`).Scan(&id))
	ch, err := amqptest.Conn(t).Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(ctx, "", top.Queue, false, false, amqp.Publishing{MessageId: id, Type: "order.placed"}))
	require.Eventually(t, func() bool { return svc.Consumers()[0].Stats().Duplicates == 1 }, 30*time.Second, 10*time.Millisecond)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context's end")
	}
	require.Equal(t, int64(n), count(), "each committed event applied once, the rolled back one never")
	require.Equal(t, int64(n), svc.Relay().Stats().Published)
	require.Equal(t, int64(n), svc.Consumers()[0].Stats().Handled)
	pending, err := store.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, pending)
	require.EqualError(t, svc.Run(ctx), "service: Run called twice")
}

// TestServiceStopsOnWhatNothingRepairs: a relay that stops with an error
// (its table is not an outbox table) stops the consumers too, and Run
// returns the error at once rather than running on without a relay.
func TestServiceStopsOnWhatNothingRepairs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	table, inboxTable := dbtest.Table(t), dbtest.Table(t)
	_, err := db.ExecContext(ctx, `CREATE TABLE "`+table+`" (id int)`) // not an outbox table
	require.NoError(t, err)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "svc", Table: inboxTable})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	top := amqptest.Declare(t, amqptest.Conn(t))
	svc, err := service.New(&service.Config{
		DB: db, AMQPURLs: []string{amqptest.URL()}, Table: table,
		Inbox: &inbox.Config{Consumer: "svc", Table: inboxTable},
		Consumers: []*inbox.ConsumerConfig{{Queue: top.Queue,
			Handler: func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }}},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, outbox.ErrInvalidTable)
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30s after its relay met a table that is not an outbox")
	}
}

// TestNewRefusesMisuse: what cannot run is an error from New, before
// anything starts.
func TestNewRefusesMisuse(t *testing.T) {
	db := dbtest.DB(t)
	handler := func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil }
	for _, tc := range []struct {
		cfg  *service.Config
		want string
	}{
		{nil, "service: Config.DB is required"},
		{&service.Config{}, "service: Config.DB is required"},
		{&service.Config{DB: db, NoRelay: true}, "service: nothing to run: Config.NoRelay and no Consumers"},
		{&service.Config{DB: db, Table: "a;b"}, "invalid"},
		{&service.Config{DB: db, Consumers: []*inbox.ConsumerConfig{{Queue: "q", Handler: handler}}}, "Config.Consumer is required"},
		{&service.Config{DB: db, Inbox: &inbox.Config{Consumer: "c"}, Consumers: []*inbox.ConsumerConfig{nil}}, "service: Config.Consumers[0] is nil"},
		{&service.Config{DB: db, Inbox: &inbox.Config{Consumer: "c"}, Consumers: []*inbox.ConsumerConfig{{Queue: "q"}}}, "service: Config.Consumers[0]: inbox: ConsumerConfig.Handler is required"},
		{&service.Config{DB: db, Relay: &relay.Config{Lease: time.Millisecond}}, "Lease"},
	} {
		_, err := service.New(tc.cfg)
		require.Error(t, err)
		require.Contains(t, err.Error(), tc.want)
	}
}
