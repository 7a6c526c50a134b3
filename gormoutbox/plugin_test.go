package gormoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/schema"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/dbtest"
)

func TestMain(m *testing.M) {
	// PrepareStmt's statement cache starts a goroutine GORM never stops.
	dbtest.Main(m, goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"))
}

type Order struct {
	ID     uint `gorm:"primaryKey"`
	Status string
	Total  int
	Lines  []Line
	outbox.Recorder
}

type Line struct {
	ID      uint `gorm:"primaryKey"`
	OrderID uint
	SKU     string
	outbox.Recorder
}

type Plain struct {
	ID   uint `gorm:"primaryKey"`
	Name string
}

type Coupon struct {
	Code string `gorm:"primaryKey"`
	Name string
	outbox.Recorder
}

// Shipment records an event in its own AfterCreate hook, when its id is known.
type Shipment struct {
	ID uint `gorm:"primaryKey"`
	outbox.Recorder
}

func (s *Shipment) AfterCreate(*gorm.DB) error {
	s.Record(outbox.Event{Type: "shipment.created", Key: fmt.Sprint(s.ID)})
	return nil
}

type testBundle struct {
	db     *gorm.DB
	sqlDB  *sql.DB
	schema string
}

// setup opens GORM on a schema of the test's own, with the plugin and the
// test models migrated.
func setup(t testing.TB, plugin *gormoutbox.Plugin, cfg *gorm.Config) *testBundle {
	t.Helper()
	sqlDB := dbtest.DB(t)
	sch := dbtest.Schema(t)
	if cfg == nil {
		cfg = &gorm.Config{}
	}
	cfg.NamingStrategy = schema.NamingStrategy{TablePrefix: sch + "."}
	cfg.Logger = logger.Discard
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), cfg)
	require.NoError(t, err)
	if plugin == nil {
		plugin = &gormoutbox.Plugin{}
	}
	plugin.Table = sch + ".outbox"
	require.NoError(t, db.Use(plugin))
	store, err := outbox.NewStore(sqlDB, &outbox.StoreConfig{Table: plugin.Table})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	require.NoError(t, db.Session(&gorm.Session{}).AutoMigrate(&Order{}, &Line{}, &Plain{}, &Coupon{}, &Shipment{}))
	return &testBundle{db: db, sqlDB: sqlDB, schema: sch}
}

// events returns "type/key" of every outbox row, oldest first, read on a
// connection of its own (so only committed rows show).
func (b *testBundle) events(t *testing.T) []string {
	t.Helper()
	return dbtest.EventKeys(t, b.sqlDB, b.schema+".outbox")
}

func (b *testBundle) count(t *testing.T, table string) int64 {
	t.Helper()
	return dbtest.Count(t, b.sqlDB, `SELECT count(*) FROM `+b.schema+`.`+table)
}

func evt(typ, key string) outbox.Event {
	return outbox.Event{Type: typ, Key: key, Payload: []byte("{}")}
}

func TestEachOperationWritesItsEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	db := b.db

	order := Order{Status: "new", Total: 10}
	order.Record(evt("order.placed", "1"))
	require.NoError(t, db.Create(&order).Error)
	require.Equal(t, []string{"order.placed/1"}, b.events(t))
	require.Empty(t, order.PendingEvents(), "written events are pulled from the model")

	order.Status = "paid"
	order.Record(evt("order.paid", "1"))
	require.NoError(t, db.Save(&order).Error)

	order.Record(evt("order.discounted", "1"))
	require.NoError(t, db.Model(&order).Updates(map[string]any{"total": 8}).Error)

	order.Record(evt("order.shipped", "1"))
	require.NoError(t, db.Model(&order).Update("status", "shipped").Error)

	order.Record(evt("order.deleted", "1"))
	require.NoError(t, db.Delete(&order).Error)

	require.Equal(t, []string{"order.placed/1", "order.paid/1", "order.discounted/1", "order.shipped/1", "order.deleted/1"}, b.events(t))
	require.Zero(t, b.count(t, "orders"))

	// Events recorded by the model's own AfterCreate hook are written too.
	s := Shipment{}
	require.NoError(t, db.Create(&s).Error)
	require.Contains(t, b.events(t), fmt.Sprintf("shipment.created/%d", s.ID))
}

func TestUserTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)

	boom := errors.New("boom")
	err := b.db.Transaction(func(tx *gorm.DB) error {
		order := Order{Status: "new"}
		order.Record(evt("order.placed", "r"))
		require.NoError(t, tx.Create(&order).Error)
		require.NoError(t, gormoutbox.Publish(tx, evt("audit.logged", "r")))

		var inTx int64
		require.NoError(t, tx.Table(b.schema+".outbox").Count(&inTx).Error)
		require.EqualValues(t, 2, inTx, "visible inside the transaction")
		require.Zero(t, b.count(t, "outbox"), "invisible to other connections before commit")
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, b.count(t, "orders"))
	require.Empty(t, b.events(t))

	require.NoError(t, b.db.Transaction(func(tx *gorm.DB) error {
		order := Order{Status: "new"}
		order.Record(evt("order.placed", "c"))
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return gormoutbox.Publish(tx, evt("audit.logged", "c"))
	}))
	require.EqualValues(t, 1, b.count(t, "orders"))
	require.Equal(t, []string{"order.placed/c", "audit.logged/c"}, b.events(t))
}

func TestBatchesAndAssociations(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	db := b.db

	values := make([]Order, 3)
	for i := range values {
		values[i].Record(evt("order.placed", fmt.Sprint("v", i)))
	}
	require.NoError(t, db.Create(&values).Error)

	pointers := []*Order{{}, {}}
	for i, o := range pointers {
		o.Record(evt("order.placed", fmt.Sprint("p", i)))
	}
	require.NoError(t, db.Create(&pointers).Error)

	batched := make([]Order, 5)
	for i := range batched {
		batched[i].Record(evt("order.placed", fmt.Sprint("b", i)))
	}
	require.NoError(t, db.CreateInBatches(&batched, 2).Error)

	withLines := Order{Lines: []Line{{SKU: "a"}, {SKU: "b"}}}
	withLines.Record(evt("order.placed", "withlines"))
	withLines.Lines[0].Record(evt("line.added", "a"))
	withLines.Lines[1].Record(evt("line.added", "b"))
	require.NoError(t, db.Create(&withLines).Error)

	require.ElementsMatch(t, []string{
		"order.placed/v0", "order.placed/v1", "order.placed/v2",
		"order.placed/p0", "order.placed/p1",
		"order.placed/b0", "order.placed/b1", "order.placed/b2", "order.placed/b3", "order.placed/b4",
		"order.placed/withlines", "line.added/a", "line.added/b",
	}, b.events(t))
	require.EqualValues(t, 11, b.count(t, "orders"))
	require.EqualValues(t, 2, b.count(t, "lines"))
}

func TestFailedSavepointTakesOnlyItsOwnEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	require.NoError(t, b.db.Transaction(func(tx *gorm.DB) error {
		outer := Order{Status: "outer"}
		outer.Record(evt("order.placed", "outer"))
		require.NoError(t, tx.Create(&outer).Error)
		err := tx.Transaction(func(tx2 *gorm.DB) error {
			inner := Order{Status: "inner"}
			inner.Record(evt("order.placed", "inner"))
			require.NoError(t, tx2.Create(&inner).Error)
			return errors.New("inner fails")
		})
		require.Error(t, err)
		return nil
	}))
	require.Equal(t, []string{"order.placed/outer"}, b.events(t))
	require.EqualValues(t, 1, b.count(t, "orders"))
}

func TestOutboxFailureRollsBackTheBusinessRow(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	_, err := b.sqlDB.Exec(`DROP TABLE ` + b.schema + `.outbox`)
	require.NoError(t, err)

	order := Order{Status: "new"}
	order.Record(evt("order.placed", "x"))
	err = b.db.Create(&order).Error
	require.ErrorContains(t, err, "does not exist")
	require.ErrorContains(t, err, "gormoutbox: create of Order")
	require.Zero(t, b.count(t, "orders"), "GORM's implicit transaction rolled the order back")

	// Models without events are not affected by a missing outbox.
	require.NoError(t, b.db.Create(&Plain{Name: "x"}).Error)
}

func TestSkipDefaultTransaction(t *testing.T) {
	t.Parallel()

	t.Run("BeginIfNeeded", func(t *testing.T) {
		t.Parallel()
		for name, b := range map[string]*testBundle{
			"global":  setup(t, nil, &gorm.Config{SkipDefaultTransaction: true}),
			"session": setup(t, nil, nil),
		} {
			db := b.db.Session(&gorm.Session{SkipDefaultTransaction: true})
			order := Order{Status: "new"}
			order.Record(evt("order.placed", name))
			require.NoError(t, db.Create(&order).Error, name)
			require.Equal(t, []string{"order.placed/" + name}, b.events(t), name)

			// The plugin's transaction covers both writes: without an outbox
			// table the order is rolled back too.
			_, err := b.sqlDB.Exec(`DROP TABLE ` + b.schema + `.outbox`)
			require.NoError(t, err)
			failing := Order{Status: "lost"}
			failing.Record(evt("order.placed", "lost"))
			require.Error(t, db.Create(&failing).Error, name)
			require.EqualValues(t, 1, b.count(t, "orders"), name)
			require.NoError(t, db.Create(&Plain{}).Error, "plain models need no transaction")
		}
	})

	t.Run("RequireTx", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &gormoutbox.Plugin{TxMode: gormoutbox.RequireTx}, &gorm.Config{SkipDefaultTransaction: true})
		order := Order{Status: "new"}
		order.Record(evt("order.placed", "strict"))
		err := b.db.Create(&order).Error
		require.ErrorIs(t, err, outbox.ErrNoTransaction)
		require.ErrorContains(t, err, "RequireTx")
		require.Zero(t, b.count(t, "orders"), "refused before the business write")
		require.Len(t, order.PendingEvents(), 1, "the events stay on the model")

		require.NoError(t, b.db.Create(&Plain{Name: "ok"}).Error)
		require.NoError(t, b.db.Transaction(func(tx *gorm.DB) error { return tx.Create(&order).Error }))
		require.Equal(t, []string{"order.placed/strict"}, b.events(t))
	})

	t.Run("PublishOutsideATransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		require.ErrorIs(t, gormoutbox.Publish(b.db, evt("x", "y")), outbox.ErrNoTransaction)
		require.Empty(t, b.events(t))
	})
}

func TestSaveOfANewRowAndSkippedCreates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)

	// Save of a row that does not exist: the update finds nothing, GORM
	// falls back to a create, and the event is written once.
	fresh := Order{ID: 4242, Status: "new"}
	fresh.Record(evt("order.placed", "4242"))
	require.NoError(t, b.db.Save(&fresh).Error)
	require.Equal(t, []string{"order.placed/4242"}, b.events(t))

	// A create skipped by ON CONFLICT DO NOTHING writes no create event.
	require.NoError(t, b.db.Create(&Coupon{Code: "SAVE10", Name: "first"}).Error)
	dup := Coupon{Code: "SAVE10", Name: "second"}
	dup.Record(evt("coupon.created", "SAVE10"))
	require.NoError(t, b.db.Clauses(clause.OnConflict{DoNothing: true}).Create(&dup).Error)
	require.Equal(t, []string{"order.placed/4242"}, b.events(t))
	require.Len(t, dup.PendingEvents(), 1, "the event was not consumed")
}

func TestPrepareStmt(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, &gorm.Config{PrepareStmt: true})
	for i := range 3 {
		order := Order{}
		order.Record(evt("order.placed", fmt.Sprint(i)))
		require.NoError(t, b.db.Create(&order).Error)
	}
	err := b.db.Transaction(func(tx *gorm.DB) error {
		order := Order{}
		order.Record(evt("order.placed", "rolled-back"))
		require.NoError(t, tx.Create(&order).Error)
		return errors.New("rollback")
	})
	require.Error(t, err)
	require.Equal(t, []string{"order.placed/0", "order.placed/1", "order.placed/2"}, b.events(t))
}

func TestAttach(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	db := gormoutbox.Attach(b.db, evt("plain.created", "1"))
	db = gormoutbox.Attach(db, evt("plain.audited", "1"))
	require.NoError(t, db.Create(&Plain{Name: "a"}).Error)
	require.NoError(t, db.Create(&Plain{Name: "b"}).Error, "the same *gorm.DB again")
	require.Equal(t, []string{"plain.created/1", "plain.audited/1"}, b.events(t), "attached events are written once")
	require.EqualValues(t, 2, b.count(t, "plains"))

	// Sessions derived from an attached *gorm.DB share its events: written
	// once, by the first write, whichever session runs it.
	attached := gormoutbox.Attach(b.db, evt("batch.imported", "2"))
	require.NoError(t, attached.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&Plain{Name: "c"}).Error)
		return tx.Session(&gorm.Session{}).Create(&Plain{Name: "d"}).Error
	}))
	require.NoError(t, attached.Create(&Plain{Name: "e"}).Error)
	require.NoError(t, b.db.Transaction(func(tx *gorm.DB) error {
		return gormoutbox.Attach(tx, evt("plain.removed", "3")).Where("name = ?", "e").Delete(&Plain{}).Error
	}))
	require.Equal(t, []string{"plain.created/1", "plain.audited/1", "batch.imported/2", "plain.removed/3"}, b.events(t))
}

func TestMisuse(t *testing.T) {
	t.Parallel()
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: dbtest.DB(t)}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		require.ErrorIs(t, gormoutbox.Publish(tx, evt("x", "y")), gormoutbox.ErrNotRegistered)
		return nil
	}))
	err = db.Use(&gormoutbox.Plugin{Table: "outbox; DROP TABLE x"})
	require.ErrorIs(t, err, outbox.ErrInvalidTable)
	require.ErrorContains(t, err, "gormoutbox")

	b := setup(t, nil, nil)
	require.NoError(t, b.db.Transaction(func(tx *gorm.DB) error {
		err := gormoutbox.Publish(tx, outbox.Event{})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		return nil
	}))
}

type traceKey struct{}

func TestHeadersFromStatementContext(t *testing.T) {
	t.Parallel()
	b := setup(t, &gormoutbox.Plugin{Headers: func(ctx context.Context) map[string]string {
		tp, _ := ctx.Value(traceKey{}).(string)
		return map[string]string{"traceparent": tp}
	}}, nil)
	ctx := context.WithValue(context.Background(), traceKey{}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	order := Order{}
	order.Record(outbox.Event{Type: "order.placed", Headers: map[string]string{"tenant": "acme"}})
	require.NoError(t, b.db.WithContext(ctx).Create(&order).Error)
	var headers string
	require.NoError(t, b.sqlDB.QueryRow(`SELECT headers::text FROM `+b.schema+`.outbox`).Scan(&headers))
	require.JSONEq(t, `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tenant":"acme"}`, headers)
}

// TestOrderedMode: with Plugin.Ordering, a GORM transaction that records an
// event of a key holds that key until it ends: a second writer of the key
// waits for it, so the key's order is the order of the commits.
func TestOrderedMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &gormoutbox.Plugin{Ordering: outbox.OrderedByKey}, nil)
	first := b.db.WithContext(ctx).Begin()
	require.NoError(t, first.Error)
	order := Order{Status: "new"}
	order.Record(evt("order.placed", "order-9"))
	require.NoError(t, first.Create(&order).Error)

	second := b.db.WithContext(ctx).Begin()
	require.NoError(t, second.Error)
	var pid int
	require.NoError(t, second.Raw("SELECT pg_backend_pid()").Scan(&pid).Error)
	done := make(chan error, 1)
	go func() {
		other := Order{Status: "new"}
		other.Record(evt("order.placed", "order-9"))
		done <- second.Create(&other).Error
	}()
	dbtest.AwaitAdvisoryWait(t, b.sqlDB, pid) // the second writer of order-9 waits
	require.NoError(t, first.Commit().Error)
	require.NoError(t, <-done)
	require.NoError(t, second.Commit().Error)
	require.Equal(t, []string{"order.placed/order-9", "order.placed/order-9"}, b.events(t))
}
