package entoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"entgo.io/ent"
	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/entoutbox"
	"github.com/acemq/outbox/entoutbox/internal/noexec"
	"github.com/acemq/outbox/entoutbox/internal/testent"
	"github.com/acemq/outbox/entoutbox/internal/testent/order"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type testBundle struct {
	client *testent.Client
	ob     *entoutbox.Outbox
	db     *sql.DB // the test's pool, search_path set to its schema
	other  *sql.DB // another pool, to look from outside the transaction
	schema string
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with an Outbox of the given configuration.
func setupWith(t testing.TB, cfg *entoutbox.Config) *testBundle {
	t.Helper()
	ctx := context.Background()
	db, sch := dbtest.SchemaDB(t)
	store, err := outbox.NewStore(db, nil)
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))

	client := testent.NewClient(testent.Driver(entsql.OpenDB(dialect.Postgres, db)))
	require.NoError(t, client.Schema.Create(ctx))
	ob, err := entoutbox.New(cfg)
	require.NoError(t, err)
	client.Use(entoutbox.Hook[*testent.Tx](ob))
	return &testBundle{client: client, ob: ob, db: db, other: dbtest.DB(t), schema: sch}
}

// events returns "type/key" of the committed outbox rows, oldest first.
func (b *testBundle) events(t *testing.T) []string {
	t.Helper()
	return dbtest.EventKeys(t, b.other, b.schema+".outbox")
}

func (b *testBundle) count(t *testing.T, table string) int64 {
	t.Helper()
	return dbtest.Count(t, b.other, `SELECT count(*) FROM `+b.schema+`.`+table)
}

func evt(typ, key string) outbox.Event { return outbox.Event{Type: typ, Key: key} }

// orderRule emits "order.<op>" with the order's id for every order mutation.
func orderRule(ctx context.Context, c entoutbox.Change) ([]outbox.Event, error) {
	return []outbox.Event{{Type: "order." + c.Mutation.Op().String(), Key: fmt.Sprint(c.ID)}}, nil
}

func TestTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.ob.On("Order", ent.OpCreate, orderRule)

	tx, err := b.client.Tx(ctx)
	require.NoError(t, err)
	o, err := tx.Order.Create().SetTotal(10).Save(entoutbox.WithEvents(ctx, evt("audit.logged", "rolled-back")))
	require.NoError(t, err)
	require.NotZero(t, o.ID)
	require.Empty(t, b.events(t), "invisible to other connections before commit")
	require.NoError(t, tx.Rollback())
	require.Zero(t, b.count(t, "orders"))
	require.Empty(t, b.events(t))

	tx, err = b.client.Tx(ctx)
	require.NoError(t, err)
	o, err = tx.Order.Create().SetTotal(20).Save(entoutbox.WithEvents(ctx, evt("audit.logged", "committed")))
	require.NoError(t, err)
	require.NoError(t, b.ob.Publish(ctx, tx, evt("explicit.event", "x")))
	require.NoError(t, tx.Commit())
	require.EqualValues(t, 1, b.count(t, "orders"))
	require.Equal(t, []string{"audit.logged/committed", fmt.Sprintf("order.OpCreate/%d", o.ID), "explicit.event/x"}, b.events(t))
}

func TestOutsideATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.ob.On("Order", ent.OpCreate, orderRule)

	_, err := b.client.Order.Create().Save(ctx)
	require.ErrorIs(t, err, outbox.ErrNoTransaction, "a rule matches: the create would carry an event")
	_, err = b.client.Customer.Create().SetName("ann").Save(entoutbox.WithEvents(ctx, evt("customer.created", "ann")))
	require.ErrorIs(t, err, outbox.ErrNoTransaction)
	require.ErrorContains(t, err, "Customer OpCreate outside a transaction")
	require.Zero(t, b.count(t, "orders"), "refused before the business write")
	require.Zero(t, b.count(t, "customers"))

	c, err := b.client.Customer.Create().SetName("bob").Save(ctx)
	require.NoError(t, err, "mutations without events pass untouched")
	require.Equal(t, "bob", c.Name)
	require.NoError(t, b.client.Customer.UpdateOne(c).SetName("bobby").Exec(ctx))
	require.Empty(t, b.events(t))

	err = b.ob.Publish(ctx, b.client, evt("x", "y"))
	require.ErrorIs(t, err, outbox.ErrNoTransaction)
}

func TestWithoutTheExecQueryFeature(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, sch := dbtest.SchemaDB(t)
	client := noexec.NewClient(noexec.Driver(entsql.OpenDB(dialect.Postgres, db)))
	require.NoError(t, client.Schema.Create(ctx))
	ob, err := entoutbox.New(nil)
	require.NoError(t, err)
	client.Use(entoutbox.Hook[*noexec.Tx](ob))

	tx, err := client.Tx(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().Save(entoutbox.WithEvents(ctx, evt("order.placed", "1")))
	require.ErrorIs(t, err, entoutbox.ErrNoExecContext)
	require.ErrorContains(t, err, "--feature sql/execquery")
	require.NoError(t, tx.Commit())
	require.Zero(t, dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM `+sch+`.orders`), "failed before the mutation ran")
}

func TestWithEventsWrittenOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tx, err := b.client.Tx(ctx)
	require.NoError(t, err)
	ctx = entoutbox.WithEvents(ctx, evt("checkout.completed", "c1"))
	_, err = tx.Customer.Create().SetName("ann").Save(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().Save(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().Save(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, []string{"checkout.completed/c1"}, b.events(t))
}

func TestFailedMutationKeepsContextEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.ob.On("Order", ent.OpCreate, func(context.Context, entoutbox.Change) ([]outbox.Event, error) {
		return nil, errors.New("rule refuses")
	})
	tx, err := b.client.Tx(ctx)
	require.NoError(t, err)
	ctx = entoutbox.WithEvents(ctx, evt("first", "1"))
	_, err = tx.Order.Create().Save(ctx)
	require.ErrorContains(t, err, "rule refuses")
	require.NoError(t, tx.Rollback())
	require.Zero(t, b.count(t, "orders"))
	require.Empty(t, b.events(t))
}

func TestRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.ob.On("Order", ent.OpCreate|ent.OpUpdateOne|ent.OpDeleteOne|ent.OpUpdate, orderRule)

	tx, err := b.client.Tx(ctx)
	require.NoError(t, err)
	created, err := tx.Order.Create().Save(ctx)
	require.NoError(t, err)
	_, err = tx.Order.UpdateOneID(created.ID).SetStatus("paid").Save(ctx)
	require.NoError(t, err)

	bulk, err := tx.Order.CreateBulk(
		tx.Order.Create().SetTotal(1), tx.Order.Create().SetTotal(2), tx.Order.Create().SetTotal(3),
		tx.Order.Create().SetTotal(4), tx.Order.Create().SetTotal(5),
	).Save(ctx)
	require.NoError(t, err)
	require.Len(t, bulk, 5)

	n, err := tx.Order.Update().Where(order.TotalGTE(4)).SetStatus("big").Save(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, tx.Order.DeleteOneID(created.ID).Exec(ctx))
	require.NoError(t, tx.Commit())

	want := []string{
		fmt.Sprintf("order.OpCreate/%d", created.ID),
		fmt.Sprintf("order.OpUpdateOne/%d", created.ID),
	}
	for _, o := range bulk { // creation order, not ent's reverse nesting order
		want = append(want, fmt.Sprintf("order.OpCreate/%d", o.ID))
	}
	want = append(want,
		fmt.Sprintf("order.OpUpdate/%d", bulk[3].ID), // one per affected row
		fmt.Sprintf("order.OpUpdate/%d", bulk[4].ID),
		fmt.Sprintf("order.OpDeleteOne/%d", created.ID),
	)
	got := b.events(t)
	require.Equal(t, want[:7], got[:7])
	require.ElementsMatch(t, want[7:9], got[7:9])
	require.Equal(t, want[9], got[9])
	require.Len(t, got, 10)
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	_, err := entoutbox.New(&entoutbox.Config{Table: "bad name"})
	require.ErrorIs(t, err, outbox.ErrInvalidTable)
}

// TestOrderedMode: with Config.Ordering, a transaction that writes an
// event of a key holds the key until it ends: a second writer of the key
// waits for it.
func TestOrderedMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupWith(t, &entoutbox.Config{Ordering: outbox.OrderedByKey})
	first, err := b.client.Tx(ctx)
	require.NoError(t, err)
	_, err = first.Order.Create().SetTotal(1).Save(entoutbox.WithEvents(ctx, evt("order.placed", "order-5")))
	require.NoError(t, err)

	second, err := b.client.Tx(ctx)
	require.NoError(t, err)
	rows, err := second.QueryContext(ctx, "SELECT pg_backend_pid()")
	require.NoError(t, err)
	var pid int
	require.True(t, rows.Next())
	require.NoError(t, rows.Scan(&pid))
	require.NoError(t, rows.Close())
	done := make(chan error, 1)
	go func() {
		_, err := second.Order.Create().SetTotal(2).Save(entoutbox.WithEvents(ctx, evt("order.paid", "order-5")))
		done <- err
	}()
	dbtest.AwaitAdvisoryWait(t, b.other, pid) // the second writer of order-5 waits
	require.NoError(t, first.Commit())
	require.NoError(t, <-done)
	require.NoError(t, second.Commit())
	require.Equal(t, []string{"order.placed/order-5", "order.paid/order-5"}, b.events(t))
}

// Issue 19: one outbox.Store, configured once, is what the hook writes
// through when given; the shorthand fields beside it are refused.
func TestHookWritesThroughASharedStore(t *testing.T) {
	t.Parallel()
	store, err := outbox.NewStore(nil, &outbox.StoreConfig{Router: outbox.ToExchange("shop")})
	require.NoError(t, err)
	b := setupWith(t, &entoutbox.Config{Store: store})
	b.ob.On("Order", ent.OpCreate, orderRule)
	ctx := context.Background()
	tx, err := b.client.Tx(ctx)
	require.NoError(t, err)
	_, err = tx.Order.Create().SetTotal(1).Save(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	outboxtest.RequireEvent(t, b.other, b.schema+".outbox", outboxtest.Match{Type: "order.OpCreate", Exchange: "shop"})
	_, err = entoutbox.New(&entoutbox.Config{Store: store, Ordering: outbox.OrderedByKey})
	require.ErrorContains(t, err, "Config.Store is set")
}
