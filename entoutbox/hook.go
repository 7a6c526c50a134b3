package entoutbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"entgo.io/ent"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/eventbox"
)

// ErrNoExecContext is returned when a mutation cannot write through its
// transaction because the ent code was generated without the
// sql/execquery feature. Nothing has been written.
var ErrNoExecContext = errors.New("entoutbox: the mutation has no ExecContext method: generate the ent code with the sql/execquery feature, " +
	"e.g. `go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./ent/schema` " +
	"(or gen.FeatureExecQuery in entc.Generate)")

// Config configures an Outbox. The zero value (and nil) gives the defaults.
type Config struct {
	// Store, when set, is the store the hook writes through: one
	// outbox.StoreConfig (table, router, headers, ordering) shared by every
	// adapter of the table (GORM, ent, pgx, database/sql) and by the relay
	// in the same process, which its writes then wake. Table, Router,
	// Headers and Ordering must be left empty with it: they are a
	// shorthand for a store of the hook's own.
	Store *outbox.Store

	// Database is the database the ent client speaks: outbox.PostgreSQL
	// (the default) or outbox.MySQL (MySQL and MariaDB, ent's
	// dialect.MySQL). A mutation whose dialect is another one's is
	// refused before it runs.
	Database outbox.Database

	// Headers adds headers taken from the mutation's context to every
	// event, for example the W3C trace context. Defaults to none.
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
}

// Change is what a rule builds its events from.
type Change struct {
	// Mutation is the mutation that ran; its fields (m.Field, m.Fields) hold
	// the values it set.
	Mutation ent.Mutation

	// ID is the id of the entity the events are about. A rule on a bulk
	// update or delete runs once per affected entity.
	ID any

	// Value is what the mutation returned: the entity for OpCreate and
	// OpUpdateOne, nil otherwise.
	Value ent.Value
}

// BuildFunc builds the events of one change. Returning an error fails the
// mutation, and the caller should roll back.
type BuildFunc func(ctx context.Context, c Change) ([]outbox.Event, error)

type rule struct {
	typ   string
	ops   ent.Op
	build BuildFunc
}

// Outbox writes events into the outbox table through the transaction of the
// ent mutations that produce them. Create it once with New and register its
// hook with client.Use(entoutbox.Hook[*ent.Tx](ob)).
type Outbox struct {
	store *outbox.Store

	mu    sync.RWMutex
	rules []rule

	framesMu sync.Mutex
	frames   map[frameKey]*frame
}

// New returns an Outbox. It fails only on a bad Config (an invalid table
// name, say).
func New(cfg *Config) (*Outbox, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	store := cfg.Store
	switch {
	case store != nil && (cfg.Table != "" || cfg.Router != nil || cfg.Headers != nil || cfg.Ordering != outbox.Unordered || cfg.Database != 0):
		return nil, errors.New("entoutbox: Config.Store is set: leave Table, Router, Headers, Ordering and Database empty, the store's configuration is the one")
	case store == nil:
		var err error
		if store, err = outbox.NewStore(nil, &outbox.StoreConfig{Table: cfg.Table, Router: cfg.Router, Headers: cfg.Headers, Ordering: cfg.Ordering, Database: cfg.Database}); err != nil {
			return nil, fmt.Errorf("entoutbox: %w", err)
		}
	}
	return &Outbox{store: store, frames: make(map[frameKey]*frame)}, nil
}

// On adds a rule: after a mutation of the given schema type ("Order", as
// m.Type() names it) with one of the given ops (ent.OpCreate|ent.OpUpdateOne,
// say) succeeds, build is called and its events are written in the
// mutation's transaction. For OpUpdate and OpDelete, which change many rows
// at once, build runs once per affected row, with the ids read before the
// mutation. It returns o, so calls can be chained.
func (o *Outbox) On(schemaType string, ops ent.Op, build BuildFunc) *Outbox {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rules = append(o.rules, rule{typ: schemaType, ops: ops, build: build})
	return o
}

func (o *Outbox) match(typ string, op ent.Op) []rule {
	o.mu.RLock()
	defer o.mu.RUnlock()
	var out []rule
	for _, r := range o.rules {
		if r.typ == typ && op.Is(r.ops) {
			out = append(out, r)
		}
	}
	return out
}

type holderKey struct{}

// WithEvents returns a context that carries events for the next mutation
// run with it (or a context derived from it): that mutation writes them in
// its transaction, once. Later mutations sharing the context do not write
// them again. Events already carried by ctx stay shared with it: whichever
// mutation comes first, through ctx or the returned context, writes them.
func WithEvents(ctx context.Context, evts ...outbox.Event) context.Context {
	return context.WithValue(ctx, holderKey{}, eventbox.New(holderFrom(ctx), evts))
}

func holderFrom(ctx context.Context) *eventbox.Box {
	h, _ := ctx.Value(holderKey{}).(*eventbox.Box)
	return h
}

// frame collects the events of mutations nested in one another under one
// context and transaction, as ent's CreateBulk nests its builders, so that
// they are written in the order the mutations started (creation order)
// rather than the reverse order in which they finish.
type frame struct {
	depth  int
	next   int
	events map[int][]outbox.Event
}

type frameKey struct {
	ctx context.Context
	tx  uintptr
}

// txIdentity returns what identifies the transaction a generated mutation
// runs in: its config's driver, a *txDriver shared by every mutation of one
// ent.Tx (m.Tx() builds a new *Tx on every call, so it cannot serve). If the
// generated code is not shaped as expected, it returns the mutation itself,
// so that nothing is ever shared across transactions: the events are then
// written at once, in the order ent finishes the mutations.
func txIdentity(m ent.Mutation) uintptr {
	v := reflect.ValueOf(m)
	self := v.Pointer()
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return self
	}
	cfg := v.Elem().FieldByName("config")
	if !cfg.IsValid() || cfg.Kind() != reflect.Struct {
		return self
	}
	drv := cfg.FieldByName("driver")
	if !drv.IsValid() || drv.Kind() != reflect.Interface || drv.IsNil() || drv.Elem().Kind() != reflect.Pointer {
		return self
	}
	return drv.Elem().Pointer()
}

func (o *Outbox) enter(k frameKey) int {
	o.framesMu.Lock()
	defer o.framesMu.Unlock()
	f := o.frames[k]
	if f == nil {
		f = &frame{events: make(map[int][]outbox.Event)}
		o.frames[k] = f
	}
	f.depth++
	seq := f.next
	f.next++
	return seq
}

// leave records the events of mutation seq and, for the outermost mutation,
// returns all events of the frame in order.
func (o *Outbox) leave(k frameKey, seq int, evts []outbox.Event) (all []outbox.Event, outermost bool) {
	o.framesMu.Lock()
	defer o.framesMu.Unlock()
	f := o.frames[k]
	f.depth--
	if len(evts) > 0 {
		f.events[seq] = evts
	}
	if f.depth > 0 {
		return nil, false
	}
	delete(o.frames, k)
	for i := 0; i < f.next; i++ {
		all = append(all, f.events[i]...)
	}
	return all, true
}

type txer[TX any] interface {
	Tx() (TX, error)
}

// Hook returns the ent hook that writes events. TX is your generated
// transaction type, which lets the hook ask each mutation whether it runs in
// a transaction (the generated m.Tx method):
//
//	client.Use(entoutbox.Hook[*ent.Tx](ob))
//
// A mutation that would carry events (from WithEvents or a rule) but runs
// outside a transaction fails with outbox.ErrNoTransaction before it writes
// anything; so does a mutation of code generated without the sql/execquery
// feature, with ErrNoExecContext; one whose dialect is neither
// PostgreSQL's nor MySQL's with an error wrapping
// outbox.ErrUnsupportedDatabase, and one whose dialect is not the store's
// (Config.Database) with an error that says so.
// Mutations without events pass through untouched, in or out of a
// transaction.
func Hook[TX any](o *Outbox) ent.Hook {
	return func(next ent.Mutator) ent.Mutator {
		return ent.MutateFunc(func(ctx context.Context, m ent.Mutation) (ent.Value, error) {
			h := holderFrom(ctx)
			rules := o.match(m.Type(), m.Op())
			if len(rules) == 0 && !h.Pending() {
				return next.Mutate(ctx, m)
			}
			if err := o.checkDialect(fmt.Sprintf("entoutbox: %s %s", m.Type(), m.Op()), m); err != nil {
				return nil, err // before the mutation: nothing is written
			}
			if _, ok := m.(outbox.Execer); !ok {
				return nil, ErrNoExecContext
			}
			tm, ok := m.(txer[TX])
			if !ok {
				return nil, fmt.Errorf("entoutbox: %s mutation has no method Tx() (%T, error): pass your generated transaction type, as in Hook[*ent.Tx]", m.Type(), *new(TX))
			}
			tx, err := tm.Tx()
			if err != nil {
				return nil, fmt.Errorf("%w (entoutbox: %s %s outside a transaction; run it in client.Tx)", outbox.ErrNoTransaction, m.Type(), m.Op())
			}
			// The generated *Tx writes through the mutation's transaction
			// and, having Commit and Rollback, is what outbox.Store.Add
			// accepts as a transaction.
			ex, ok := any(tx).(outbox.Execer)
			if !ok {
				return nil, ErrNoExecContext
			}

			// Bulk updates and deletes: read the ids before they change.
			var ids []any
			if len(rules) > 0 && m.Op().Is(ent.OpUpdate|ent.OpDelete) {
				var err error
				if ids, err = mutationIDs(ctx, m); err != nil {
					return nil, fmt.Errorf("entoutbox: reading the ids of %s %s: %w", m.Type(), m.Op(), err)
				}
			}

			key := frameKey{ctx: ctx, tx: txIdentity(m)}
			seq := o.enter(key)
			left := false
			defer func() {
				if !left { // next.Mutate panicked: do not leave the frame behind
					o.leave(key, seq, nil)
				}
			}()
			evts := h.Take() // taken now, so the first mutation to start gets them
			v, err := next.Mutate(ctx, m)
			if err == nil {
				evts, err = o.ruleEvents(ctx, evts, rules, m, v, ids)
			} else {
				h.GiveBack(evts) // not consumed: the mutation did not happen
				evts = nil
			}
			all, outermost := o.leave(key, seq, evts)
			left = true
			if err != nil || !outermost || len(all) == 0 {
				return v, err
			}
			if err := o.store.Add(ctx, ex, all...); err != nil {
				return v, fmt.Errorf("entoutbox: %s %s: %w", m.Type(), m.Op(), err)
			}
			return v, nil
		})
	}
}

// ruleEvents appends the events the rules build for m to evts.
func (o *Outbox) ruleEvents(ctx context.Context, evts []outbox.Event, rules []rule, m ent.Mutation, v ent.Value, ids []any) ([]outbox.Event, error) {
	if len(rules) == 0 {
		return evts, nil
	}
	changes := make([]Change, 0, max(1, len(ids)))
	if m.Op().Is(ent.OpUpdate | ent.OpDelete) {
		for _, id := range ids {
			changes = append(changes, Change{Mutation: m, ID: id})
		}
	} else {
		c := Change{Mutation: m, ID: mutationID(m)}
		if !m.Op().Is(ent.OpDeleteOne) {
			c.Value = v
		}
		changes = append(changes, c)
	}
	for _, r := range rules {
		for _, c := range changes {
			more, err := r.build(ctx, c)
			if err != nil {
				return nil, fmt.Errorf("entoutbox: rule for %s %s: %w", m.Type(), m.Op(), err)
			}
			evts = append(evts, more...)
		}
	}
	return evts, nil
}

// mutationID calls the generated m.ID() (T, bool), whatever T is.
func mutationID(m ent.Mutation) any {
	meth := reflect.ValueOf(m).MethodByName("ID")
	if !meth.IsValid() || meth.Type().NumIn() != 0 || meth.Type().NumOut() != 2 {
		return nil
	}
	out := meth.Call(nil)
	if !out[1].Bool() {
		return nil
	}
	return out[0].Interface()
}

// mutationIDs calls the generated m.IDs(ctx) ([]T, error), whatever T is.
func mutationIDs(ctx context.Context, m ent.Mutation) ([]any, error) {
	meth := reflect.ValueOf(m).MethodByName("IDs")
	if !meth.IsValid() || meth.Type().NumIn() != 1 || meth.Type().NumOut() != 2 {
		return nil, fmt.Errorf("mutation %T has no IDs(ctx) method", m)
	}
	out := meth.Call([]reflect.Value{reflect.ValueOf(ctx)})
	if err, _ := out[1].Interface().(error); err != nil {
		return nil, err
	}
	ids := make([]any, out[0].Len())
	for i := range ids {
		ids[i] = out[0].Index(i).Interface()
	}
	return ids, nil
}

type committer interface {
	Commit() error
	Rollback() error
}

// Publish writes events into the outbox through tx, your generated *ent.Tx
// (which has ExecContext with the sql/execquery feature): they are
// published if and only if it commits. A client outside a transaction gets
// outbox.ErrNoTransaction and nothing is written.
func (o *Outbox) Publish(ctx context.Context, tx outbox.Execer, evts ...outbox.Event) error {
	if _, ok := tx.(committer); !ok {
		return fmt.Errorf("%w (entoutbox: Publish needs the *ent.Tx of client.Tx, got %T)", outbox.ErrNoTransaction, tx)
	}
	if err := o.checkDialect("entoutbox: Publish", tx); err != nil {
		return err
	}
	if err := o.store.Add(ctx, tx, evts...); err != nil {
		return fmt.Errorf("entoutbox: %w", err)
	}
	return nil
}

// checkDialect refuses a database the library does not support, and one
// that is not the store's.
func (o *Outbox) checkDialect(who string, v any) error {
	spoken, err := dialect.Check(who, "ent dialect", dialect.OfEnt(v))
	if err != nil {
		return err
	}
	return dialect.Same(who, "ent dialect", spoken, o.store.Database() == outbox.MySQL)
}
