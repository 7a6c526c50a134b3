package gormoutbox

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"gorm.io/gorm"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/eventbox"
)

// PluginName is the name the plugin registers under (gorm.Config.Plugins).
const PluginName = "gormoutbox"

// SettingKey is the statement setting under which Attach keeps its events.
const SettingKey = "gormoutbox:events"

// ErrNotRegistered is returned by Publish when the *gorm.DB has no
// gormoutbox plugin: call db.Use(&gormoutbox.Plugin{}) first.
var ErrNotRegistered = errors.New("gormoutbox: plugin not registered: call db.Use(&gormoutbox.Plugin{}) on the *gorm.DB first")

// TxMode says what the plugin does with a statement that carries events but
// runs outside a transaction (only possible with SkipDefaultTransaction).
type TxMode int

const (
	// BeginIfNeeded opens a transaction around the statement, so that the
	// business write and its events still commit together. The default.
	BeginIfNeeded TxMode = iota

	// RequireTx refuses the statement with outbox.ErrNoTransaction before
	// the business write, for applications that want every event-carrying
	// write inside a transaction of their own.
	RequireTx
)

// Plugin is the GORM plugin that writes recorded events into the outbox in
// the same transaction as the statement that carries them. Register it with
// db.Use(&gormoutbox.Plugin{}); the zero value writes to the table "outbox"
// and routes every event to the default exchange with its type as routing
// key.
//
// Events reach the plugin three ways: models that embed outbox.Recorder (or
// otherwise implement outbox.Source) have their recorded events written when
// GORM creates, saves, updates or deletes them; Attach adds events to one
// statement; Publish writes events explicitly inside a transaction.
//
// Events are written through the statement's own connection, which is the
// transaction GORM (or the caller) opened; never through a connection of
// their own. A model's events are pulled (and cleared) when they are
// written: if the transaction then rolls back they are gone with it, and a
// retry must record them again. If the business statement itself fails, they
// stay on the model.
//
// A Plugin must not be changed after db.Use.
type Plugin struct {
	// Store, when set, is the store the plugin writes through: one
	// outbox.StoreConfig (table, router, headers, ordering) shared by every
	// adapter of the table (GORM, ent, pgx, database/sql) and by the relay
	// in the same process, which its writes then wake. Table, Router,
	// Headers and Ordering must be left empty with it: they are a
	// shorthand for a store of the plugin's own.
	Store *outbox.Store

	// Headers adds headers taken from the statement's context
	// (db.WithContext) to every event, for example the W3C trace context.
	// Defaults to none.
	Headers outbox.HeaderFunc

	// Ordering is outbox.OrderedByKey when the table is to keep the order
	// of each key (see outbox.OrderedByKey). The order is the table's: on
	// an ordered table writers of a key take turns whatever this says;
	// set it to say that this program expects one (it then takes a call's
	// keys in one statement first). Defaults to outbox.Unordered.
	Ordering outbox.Ordering

	// Router chooses exchange and routing key. Defaults to
	// outbox.ToExchange(""), the broker's default exchange.
	Router outbox.Router

	// Table is the outbox table, optionally schema-qualified. Defaults to
	// "outbox".
	Table string

	// TxMode decides what happens to event-carrying statements outside a
	// transaction. Defaults to BeginIfNeeded.
	TxMode TxMode

	store   *outbox.Store
	sources sync.Map // reflect.Type -> bool: does *T implement outbox.Source?
	started sync.Map // *gorm.Statement -> *gorm.DB: transactions the plugin opened
}

var _ gorm.Plugin = (*Plugin)(nil)

// Name returns PluginName.
func (p *Plugin) Name() string { return PluginName }

// Initialize registers the plugin's callbacks. db.Use calls it. The
// plugin's own store speaks the dialector's database: PostgreSQL
// (gorm.io/driver/postgres) or MySQL and MariaDB (gorm.io/driver/mysql).
// It refuses another dialector with an error wrapping
// outbox.ErrUnsupportedDatabase, and a Plugin.Store of the other database
// with an error that says so, and registers nothing then.
func (p *Plugin) Initialize(db *gorm.DB) error {
	spoken := dialect.Unknown
	if db.Dialector != nil {
		var err error
		if spoken, err = dialect.Check("gormoutbox: Plugin.Initialize", "GORM dialector", db.Dialector.Name()); err != nil {
			return err
		}
	}
	store, err := writerStore(p.Store, p.Table, p.Router, p.Headers, p.Ordering, spoken)
	if err != nil {
		return err
	}
	if err := dialect.Same("gormoutbox: Plugin.Initialize", "GORM dialector", spoken, store.Database() == outbox.MySQL); err != nil {
		return err
	}
	if p.TxMode != BeginIfNeeded && p.TxMode != RequireTx {
		return fmt.Errorf("gormoutbox: Plugin.TxMode %d is not BeginIfNeeded or RequireTx", p.TxMode)
	}
	p.store = store

	// For each chain: open a transaction (if needed) after the model's
	// Before hooks and before anything is written; capture after the
	// model's After hooks (which may record events) and before GORM
	// commits; close the plugin's own transaction right after capturing.
	cb := db.Callback()
	var firstErr error
	register := func(name string, err error) {
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("gormoutbox: registering callback %s: %w", name, err)
		}
	}
	register("begin_create", cb.Create().After("gorm:before_create").Before("gorm:save_before_associations").Register("gormoutbox:begin_create", p.begin))
	register("capture_create", cb.Create().After("gorm:after_create").Before("gorm:commit_or_rollback_transaction").Register("gormoutbox:capture_create", p.capture("create")))
	register("end_create", cb.Create().After("gormoutbox:capture_create").Register("gormoutbox:end_create", p.end))
	register("begin_update", cb.Update().After("gorm:before_update").Before("gorm:save_before_associations").Register("gormoutbox:begin_update", p.begin))
	register("capture_update", cb.Update().After("gorm:after_update").Before("gorm:commit_or_rollback_transaction").Register("gormoutbox:capture_update", p.capture("update")))
	register("end_update", cb.Update().After("gormoutbox:capture_update").Register("gormoutbox:end_update", p.end))
	register("begin_delete", cb.Delete().After("gorm:before_delete").Before("gorm:delete_before_associations").Register("gormoutbox:begin_delete", p.begin))
	register("capture_delete", cb.Delete().After("gorm:after_delete").Before("gorm:commit_or_rollback_transaction").Register("gormoutbox:capture_delete", p.capture("delete")))
	register("end_delete", cb.Delete().After("gormoutbox:capture_delete").Register("gormoutbox:end_delete", p.end))
	register("notify_create", cb.Create().After("gorm:commit_or_rollback_transaction").Register("gormoutbox:notify_create", p.notify))
	register("notify_update", cb.Update().After("gorm:commit_or_rollback_transaction").Register("gormoutbox:notify_update", p.notify))
	register("notify_delete", cb.Delete().After("gorm:commit_or_rollback_transaction").Register("gormoutbox:notify_delete", p.notify))
	return firstErr
}

func inTx(db *gorm.DB) bool {
	_, ok := db.Statement.ConnPool.(gorm.TxCommitter)
	return ok
}

// begin opens a transaction for a statement that may carry events and runs
// outside one. It decides by type, not by pending events, so that events
// recorded later by AfterCreate-style model hooks are covered too.
func (p *Plugin) begin(db *gorm.DB) {
	if db.Error != nil || inTx(db) || !p.mayCarryEvents(db) {
		return
	}
	if p.TxMode == RequireTx {
		_ = db.AddError(fmt.Errorf("%w (gormoutbox.RequireTx: a write of %s must run in a transaction)", outbox.ErrNoTransaction, describe(db)))
		return
	}
	tx := db.Session(&gorm.Session{NewDB: true}).Begin()
	if tx.Error != nil {
		_ = db.AddError(fmt.Errorf("gormoutbox: opening a transaction for the outbox: %w", tx.Error))
		return
	}
	db.Statement.ConnPool = tx.Statement.ConnPool
	p.started.Store(db.Statement, tx)
}

// end commits or rolls back the transaction begin opened.
func (p *Plugin) end(db *gorm.DB) {
	if !inTx(db) {
		return
	}
	v, ok := p.started.LoadAndDelete(db.Statement)
	if !ok {
		return
	}
	tx := v.(*gorm.DB)
	if db.Error != nil {
		tx.Rollback()
	} else if err := tx.Commit().Error; err != nil {
		_ = db.AddError(fmt.Errorf("gormoutbox: committing: %w", err))
	} else if _, wrote := db.InstanceGet(wroteKey); wrote {
		p.store.Notify() // committed: relays in this process claim at once
	}
	db.Statement.ConnPool = db.ConnPool
}

// capture collects the statement's events and writes them through the
// statement's transaction.
func (p *Plugin) capture(op string) func(*gorm.DB) {
	return func(db *gorm.DB) {
		if db.Error != nil {
			return // the business write failed: leave the model's events where they are
		}
		var evts []outbox.Event
		if v, ok := db.Statement.Settings.Load(SettingKey); ok {
			evts = v.(*eventbox.Box).Take()
		}
		// A statement that changed no row did not happen: an update that
		// found nothing (Save falls back to a create, which captures), a
		// create skipped by ON CONFLICT DO NOTHING.
		if db.RowsAffected > 0 && p.isSource(db.Statement.ReflectValue) {
			evts = eachSource(db.Statement.ReflectValue, evts)
		}
		if len(evts) == 0 {
			return
		}
		if !inTx(db) {
			_ = db.AddError(outbox.ErrNoTransaction)
			return
		}
		if err := p.store.Add(db.Statement.Context, db.Statement.ConnPool, evts...); err != nil {
			_ = db.AddError(fmt.Errorf("gormoutbox: %s of %s: %w", op, describe(db), err))
			return
		}
		db.InstanceSet(wroteKey, true)
	}
}

// wroteKey marks a statement that wrote events.
const wroteKey = "gormoutbox:wrote"

// notify wakes the relays of this process after GORM committed its own
// transaction (the default one around a Create, Save, Update or Delete)
// for a statement that wrote events. Inside a transaction of the caller's
// (db.Transaction), the wake-up comes from Store.Add when the events are
// written; relays then poll closely for a few milliseconds, which catches
// a prompt commit.
func (p *Plugin) notify(db *gorm.DB) {
	if db.Error != nil {
		return
	}
	if _, wrote := db.InstanceGet(wroteKey); !wrote {
		return
	}
	if started, ok := db.InstanceGet("gorm:started_transaction"); ok {
		if own, _ := started.(bool); own {
			p.store.Notify()
		}
	}
}

func describe(db *gorm.DB) string {
	if db.Statement.Schema != nil {
		return db.Statement.Schema.Name
	}
	return cmp.Or(db.Statement.Table, "a model")
}

// mayCarryEvents is true for statements with attached events and for models
// that implement outbox.Source.
func (p *Plugin) mayCarryEvents(db *gorm.DB) bool {
	if v, ok := db.Statement.Settings.Load(SettingKey); ok && v.(*eventbox.Box).Pending() {
		return true
	}
	rv := db.Statement.ReflectValue
	if !rv.IsValid() && db.Statement.Model != nil {
		rv = reflect.ValueOf(db.Statement.Model)
	}
	return p.isSource(rv)
}

var sourceType = reflect.TypeFor[outbox.Source]()

// isSource reports, once per type, whether the values (or elements) in rv
// implement outbox.Source through a pointer.
func (p *Plugin) isSource(rv reflect.Value) bool {
	if !rv.IsValid() {
		return false
	}
	t := rv.Type()
	if v, ok := p.sources.Load(t); ok {
		return v.(bool)
	}
	e := t
	for e.Kind() == reflect.Pointer || e.Kind() == reflect.Slice || e.Kind() == reflect.Array {
		e = e.Elem()
	}
	ok := e.Kind() == reflect.Struct && reflect.PointerTo(e).Implements(sourceType)
	p.sources.Store(t, ok)
	return ok
}

// eachSource appends the pulled events of every Source in rv to evts.
func eachSource(rv reflect.Value, evts []outbox.Event) []outbox.Event {
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return evts
		}
		return eachSource(rv.Elem(), evts)
	case reflect.Struct:
		if rv.CanAddr() {
			if s, ok := rv.Addr().Interface().(outbox.Source); ok {
				return append(evts, s.PullEvents()...)
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < rv.Len(); i++ {
			evts = eachSource(rv.Index(i), evts)
		}
	}
	return evts
}

// Publish writes events into the outbox through tx, which must be a
// transaction (db.Transaction, db.Begin): they are published if and only if
// it commits. Outside a transaction it returns outbox.ErrNoTransaction and
// writes nothing; without the plugin, ErrNotRegistered.
func Publish(tx *gorm.DB, evts ...outbox.Event) error {
	p, ok := tx.Config.Plugins[PluginName].(*Plugin)
	if !ok {
		return ErrNotRegistered
	}
	if len(evts) == 0 {
		return nil
	}
	if tx.Statement == nil || !inTx(tx) {
		return outbox.ErrNoTransaction
	}
	ctx := tx.Statement.Context
	if err := p.store.Add(ctx, tx.Statement.ConnPool, evts...); err != nil {
		return fmt.Errorf("gormoutbox: %w", err)
	}
	return nil
}

// Attach returns a *gorm.DB whose next write (Create, Save, Updates,
// Delete, …) also writes evts, in the same transaction. The events are
// written once, however the returned *gorm.DB is used afterwards (again,
// through Transaction, Session or chained calls). Use it for models that do
// not record their own events:
//
//	db.Transaction(func(tx *gorm.DB) error {
//		return gormoutbox.Attach(tx, evt).Create(&invoice).Error
//	})
func Attach(db *gorm.DB, evts ...outbox.Event) *gorm.DB {
	// GORM copies a statement's settings into every session derived from
	// it; they all share this one box.
	var prev *eventbox.Box
	if v, ok := db.Get(SettingKey); ok {
		prev = v.(*eventbox.Box)
	}
	return db.Set(SettingKey, eventbox.New(prev, evts))
}

// writerStore returns store, or a store of the plugin's own built from the
// shorthand fields; both at once is a mistake.
func writerStore(store *outbox.Store, table string, router outbox.Router, headers outbox.HeaderFunc, ordering outbox.Ordering, spoken string) (*outbox.Store, error) {
	if store != nil {
		if table != "" || router != nil || headers != nil || ordering != outbox.Unordered {
			return nil, errors.New("gormoutbox: Plugin.Store is set: leave Table, Router, Headers and Ordering empty, the store's configuration is the one")
		}
		return store, nil
	}
	database := outbox.PostgreSQL
	if spoken == dialect.MySQL {
		database = outbox.MySQL
	}
	store, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: table, Router: router, Headers: headers, Ordering: ordering, Database: database})
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: %w", err)
	}
	return store, nil
}
