package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// An ordered table is one whose writers take turns by key, whoever they
// are: the order is a property of the table, recorded in the database as
// its order trigger (OrderSchema), not of each program's configuration.
// The trigger runs before every row with a key is inserted, by Store.Add
// of any Store, an ORM hook or a raw INSERT or COPY: it takes the key's
// turn (the locks Store.Add takes in ordered mode, see keyLocksMax) for
// the rest of the transaction and only then numbers the row (seq), so that a key's rows are numbered in the order their writers
// commit. Stores and relays read the table's mode from the database and
// follow it (Store.CheckOrdering).

// orderTrigger is how the trigger names itself and its function.
func (t table) orderTrigger() string { return t.name + "_order" }

// Writers of an ordered table take turns by key with transaction-scoped
// advisory locks, in two sizes. A transaction takes each of its first
// keyLocksMax keys by itself: the lock of the key (by a 64-bit hash of the
// table and the key), and its slot's lock shared. Writers of other keys
// never wait for it, however many keys it holds. Past keyLocksMax keys it
// takes whole slots instead, exclusively: it then holds at most
// keyLocksMax key locks and keyLockSlots slot locks (PostgreSQL's lock
// table has room for max_locks_per_transaction × max_connections), and
// writers of any key in a slot it holds wait for it, which is what remains
// of the false sharing of slots. A key lock excludes the writers of that
// key; an exclusive slot lock excludes them all, the shared one of a key
// lock too: whichever way each of two writers of one key took it, the
// second waits for the first.
//
// What a transaction holds is recorded in four transaction-local settings
// (keyTurnSetting), which roll back with a savepoint as its locks do: n,
// the keys taken one by one; k, their hashes; f, the slots held shared; c,
// the slots held exclusively. A key whose slot it holds shared is still
// taken by itself, up to twice keyLocksMax keys, so that one call of
// Store.Add, whose keys are taken in the order of their slots, never asks
// for a slot it holds shared exclusively (two writers doing that at once
// would deadlock); past that, a transaction that wrote its keys in many
// calls may, and PostgreSQL then aborts one of the two (SQLSTATE 40P01).
const keyLocksMax = 1024

// slotOf, slotLockID and keyLockID are the SQL texts of a key's slot, of
// the lock of slot s and of the lock of key k of the table tableExpr (all
// three SQL expressions): the same texts for the trigger (keyTurn) and for
// Store.Add's statement (keyTurnSQL), so that both take the same locks.
func slotOf(k string) string {
	return `(hashtextextended(` + k + `, 0) & ` + strconv.Itoa(keyLockSlots-1) + `)`
}

func slotLockID(tableExpr, s string) string {
	return `hashtextextended(` + tableExpr + ` || ':slot:' || ` + s + `, 0)`
}

func keyLockID(tableExpr, k string) string {
	return `hashtextextended(` + tableExpr + ` || ':key:' || ` + k + `, 0)`
}

// keyTurnSetting is the prefix of the transaction-local settings that
// record which locks of the table a transaction holds.
func (t table) keyTurnSetting() string {
	h := fnv.New64a()
	h.Write([]byte(t.full))
	return fmt.Sprintf("acemq_outbox.t%016x_", h.Sum64())
}

// keyTurnMark, in a trigger function's source, tells Store.Add that the
// trigger takes keys one by one (keyTurn): before it, triggers took
// slots, and Add takes slots too for such a table.
const keyTurnMark = "acemq_outbox."

// keyTurn is the PL/pgSQL block that takes the turn of key (an expression)
// in the table whose name is the literal tableLit.
func (t table) keyTurn(tableLit, key string) string {
	return strings.NewReplacer("{g}", t.keyTurnSetting(), "{slot}", slotOf(key), "{keyid}", keyLockID(tableLit, key),
		"{slotid}", slotLockID(tableLit, "s"), "{max}", strconv.Itoa(keyLocksMax), "{max2}", strconv.Itoa(2*keyLocksMax)).Replace(`DECLARE
        s bigint := {slot};
        cs text := coalesce(nullif(current_setting('{g}c', true), ''), ',');
        h bigint;
        n int;
        ks text;
        fs text;
    BEGIN
        IF strpos(cs, ',' || s || ',') = 0 THEN -- else the slot is this transaction's
            h := {keyid};
            ks := coalesce(nullif(current_setting('{g}k', true), ''), ',');
            IF strpos(ks, ',' || h || ',') = 0 THEN -- else the key is
                n := coalesce(nullif(current_setting('{g}n', true), ''), '0')::int;
                fs := coalesce(nullif(current_setting('{g}f', true), ''), ',');
                IF n < {max2} AND (n < {max} OR strpos(fs, ',' || s || ',') > 0) THEN
                    IF strpos(fs, ',' || s || ',') = 0 THEN
                        PERFORM pg_advisory_xact_lock_shared({slotid});
                        PERFORM set_config('{g}f', fs || s || ',', true);
                    END IF;
                    PERFORM pg_advisory_xact_lock(h);
                    PERFORM set_config('{g}k', ks || h || ',', true);
                    PERFORM set_config('{g}n', (n + 1)::text, true);
                ELSE
                    PERFORM pg_advisory_xact_lock({slotid});
                    PERFORM set_config('{g}c', cs || s || ',', true);
                END IF;
            END IF;
        END IF;
    END;`)
}

// orderTriggerSQL makes the table ordered (idempotent).
func (t table) orderTriggerSQL() string {
	lit := sqlLit
	fn := t.qualified(t.orderTrigger())
	r := strings.NewReplacer("{table}", t.quoted, "{fn}", fn, "{trigger}", `"`+t.orderTrigger()+`"`,
		"{turn}", t.keyTurn(lit(t.full), "NEW.event_key"), "{seq}", lit(t.qualified(t.name+"_seq")))
	return r.Replace(`-- An ordered table: before a row with a key is written, its writer takes
-- the key's turn (its lock, or its slot's, for the rest of the transaction),
-- then the row is numbered. Whoever writes (any Store, a raw INSERT, COPY),
-- the rows of a key are numbered in the order their writers commit, which
-- is the order relays publish them in. A statement that inserts rows of
-- several keys takes their turns in the order of its rows: two such
-- statements with the keys in opposite orders can deadlock (PostgreSQL then
-- aborts one, SQLSTATE 40P01); Store.Add takes them sorted first.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {turn}
    NEW.seq := nextval({seq});
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} BEFORE INSERT ON {table}
    FOR EACH ROW WHEN (NEW.event_key <> '') EXECUTE FUNCTION {fn}();
`)
}

// unorderTriggerSQL makes the table unordered (idempotent).
func (t table) unorderTriggerSQL() string {
	return "DROP TRIGGER IF EXISTS \"" + t.orderTrigger() + "\" ON " + t.quoted + ";\n" +
		"DROP FUNCTION IF EXISTS " + t.qualified(t.orderTrigger()) + "();\n"
}

// orderedNow is a condition, evaluated once per statement, that holds when
// the table is ordered.
func (t table) orderedNow() string {
	return `EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = '` + t.quoted + `'::regclass AND tgname = '` +
		t.orderTrigger() + `' AND tgenabled <> 'D')`
}

// OrderSchema returns the DDL that makes the outbox table of the given name
// an ordered table (see OrderedByKey): run it after Schema, in a migration,
// or let `outbox schema --ordered` print both. On a table that has
// messages and running relays, prefer Store.ConvertOrdering (`outbox
// convert --to ordered`). The statements are idempotent.
func OrderSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.orderTriggerSQL(), nil
}

// orderMode is the one place a Store keeps the order its claims keep:
// the mode it was configured with, and the table's mode as it last
// learnt it. It learns it by observe, and only from what the table said:
// CheckOrdering (every relay runs it when it starts and every second), a
// conversion, a claim that found the table ordered, a write that found it
// unordered. Reading the mode (TableOrdering) changes nothing. Backends
// keep no mode: each claim and settle is told whether it is ordered.
type orderMode struct {
	configured Ordering     // StoreConfig.Ordering
	read       atomic.Int32 // 0: not learnt; modeUnordered; modeOrdered
	at         atomic.Int64 // when, in Unix nanoseconds
}

const (
	modeUnordered = 1
	modeOrdered   = 2
)

// modeFresh is how long Add trusts a read that the table is unordered
// before it asks again (see Store.Add).
const modeFresh = time.Second

// observe records that the table's mode is o.
func (m *orderMode) observe(o Ordering) {
	v := int32(modeUnordered)
	if o == OrderedByKey {
		v = modeOrdered
	}
	m.read.Store(v)
	m.at.Store(time.Now().UnixNano())
}

// observeOrdered is observe of an ordered (or unordered) table.
func (m *orderMode) observeOrdered(ordered bool) {
	if ordered {
		m.observe(OrderedByKey)
	} else {
		m.observe(Unordered)
	}
}

// current is the mode claims keep now: the table's as last learnt, or,
// before that, the configured one.
func (m *orderMode) current() Ordering {
	switch m.read.Load() {
	case modeUnordered:
		return Unordered
	case modeOrdered:
		return OrderedByKey
	}
	return m.configured
}

// knownUnordered reports whether the table was learnt unordered lately.
func (m *orderMode) knownUnordered() bool {
	return m.read.Load() == modeUnordered && time.Since(time.Unix(0, m.at.Load())) < modeFresh
}

// Ordering returns the order the store's claims keep now: the table's, as
// last read from the database (Store.CheckOrdering, which every relay runs
// when it starts and every second), or, before that, StoreConfig.Ordering.
func (s *Store) Ordering() Ordering { return s.order.current() }

// tableOrder is what the catalog says of a table's order: whether it has
// its order trigger, whether it has seq, and the CACHE of the sequence seq
// owns (not valid when it owns none).
type tableOrder struct {
	ordered, hasSeq bool
	cache           sql.NullInt64
}

// readOrder reads the table's order from the catalog, in one round trip
// (relays do it every second); it records nothing.
func (s *Store) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	return s.readOrderOf(ctx, db, "seq")
}

// readOrderSQL reads whether a table is ordered (its order trigger), and
// the column that numbers a key's rows ($3) with the cache of the
// sequence it owns.
//
// The sequence the column owns (OWNED BY): the column's indexes depend
// on it too, so it is not just any dependent object. refclassid makes
// the look an index scan of pg_depend (its reference index leads with
// it): without it, a generic plan scanned all of pg_depend, 90ms on a
// database of a thousand log tables, and the relays of a group of such
// tables, which read the mode before each claim, waited on it.
const readOrderSQL = `SELECT
	EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2 AND tgenabled <> 'D'),
	a.attnum IS NOT NULL, s.seqcache
FROM (SELECT 1) AS one
LEFT JOIN pg_attribute AS a ON a.attrelid = to_regclass($1) AND a.attname = $3 AND NOT a.attisdropped
LEFT JOIN (pg_depend AS d JOIN pg_sequence AS s ON s.seqrelid = d.objid)
	ON d.refclassid = 'pg_class'::regclass AND d.refobjid = a.attrelid AND d.refobjsubid = a.attnum
	AND d.classid = 'pg_class'::regclass AND d.deptype = 'a'`

// readOrderOf is readOrder of the column that numbers a key's rows: seq on
// a table of the rows layout, ord on one of the log layout.
func (s *Store) readOrderOf(ctx context.Context, db *sql.DB, column string) (tableOrder, error) {
	var o tableOrder
	err := db.QueryRowContext(ctx, readOrderSQL,
		s.t.quoted, s.t.orderTrigger(), column).Scan(&o.ordered, &o.hasSeq, &o.cache)
	if err != nil {
		return o, fmt.Errorf("outbox: reading the order of %s: %w", s.t.full, err)
	}
	return o, nil
}

// seqUnsafe returns an error wrapping ErrOrderingUnsafe when the table's
// column that numbers a key's rows (see readOrderOf) cannot number them in
// commit order.
func (s *Store) seqUnsafe(o tableOrder, column string) error {
	if column == "ord" && (!o.hasSeq || !o.cache.Valid || o.cache.Int64 > 1) {
		return fmt.Errorf("%w: %s has no ord column numbered by a sequence of its own that does not cache: bring it up to date with `outbox schema --layout log --apply`", ErrOrderingUnsafe, s.t.full)
	}
	switch {
	case !o.hasSeq:
		return fmt.Errorf("%w: %s has no seq column: apply migration 000002 (or `outbox schema --apply`)", ErrOrderingUnsafe, s.t.full)
	case !o.cache.Valid:
		return fmt.Errorf("%w: the seq column of %s is not numbered by its own sequence: apply migration 000002", ErrOrderingUnsafe, s.t.full)
	case o.cache.Int64 > 1:
		return fmt.Errorf("%w: the sequence of %s caches %d numbers per session, so a later writer of a key can get a smaller one: ALTER SEQUENCE ... CACHE 1", ErrOrderingUnsafe, s.t.full, o.cache.Int64)
	}
	return nil
}

// TableOrdering reads the table's mode from the database: OrderedByKey for
// an ordered table (one with its order trigger: OrderSchema, or on a table
// of the log layout `outbox schema --layout log --ordered`), Unordered
// otherwise.
func (s *Store) TableOrdering(ctx context.Context) (Ordering, error) {
	db, err := s.pool()
	if err != nil {
		return Unordered, err
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return Unordered, err
	}
	o, err := ops.readOrder(ctx, db)
	if err != nil || !o.ordered {
		return Unordered, err
	}
	return OrderedByKey, nil
}

// CheckOrdering reads the table's mode (see TableOrdering), which the
// store's claims follow from then on, and reports whether the table keeps
// the order that the store is configured for. The error wraps
// ErrOrderingUnsafe when StoreConfig.Ordering is OrderedByKey and the table
// is not ordered (convert it: Store.ConvertOrdering, `outbox convert --to
// ordered`), and when an ordered table cannot keep its order: it must have
// the second version's order (seq; apply migration 000002) and the
// sequence behind seq must not cache numbers (CACHE 1), or sessions
// holding cached blocks would give a later writer of a key a smaller
// number than an earlier one. It is another error when the table could
// not be read. Relays check it when they start, and every second while
// they run: one round trip.
func (s *Store) CheckOrdering(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return err
	}
	column := ops.orderColumn()
	o, err := ops.readOrder(ctx, db)
	if err != nil {
		return err
	}
	s.order.observeOrdered(o.ordered)
	switch {
	case o.ordered:
		return s.seqUnsafe(o, column)
	case s.order.configured == OrderedByKey:
		return fmt.Errorf("%w: %s is not an ordered table, and this store is configured OrderedByKey: make it one with `outbox convert --to ordered` (Store.ConvertOrdering), safe while writers and relays run", ErrOrderingUnsafe, s.t.full)
	}
	return nil
}

// OrderingConversion is what ConvertOrdering did, or would do.
type OrderingConversion struct {
	// From and To are the table's mode before and after.
	From, To Ordering
	// Pending counts the messages waiting to be published, which relays
	// publish in the new mode from their next claim.
	Pending int64
	// Held counts the messages held behind a failed message of their key
	// (ordered mode), which relays bring back once the table is unordered.
	Held int64
	// DDL is the script that changes the mode (empty when the table is in
	// that mode already).
	DDL string
	// Took is how long writers waited: the conversion's transaction.
	Took time.Duration
}

// ConvertOrdering makes the table ordered (to OrderedByKey) or unordered,
// online. Making it ordered creates its order trigger (OrderSchema); making
// it unordered drops it. Either takes the table's SHARE ROW EXCLUSIVE lock
// for a moment, waiting at most lockTimeout (1ms or more) for the writers
// in progress; writers that start after it commits write in the new mode. Relays follow
// at once: an unordered claim never takes a message with a key from an
// ordered table (it checks the mode in the statement), and every relay
// reads the mode again within a second, then claims in the new one. The
// order is kept for every message written after an ordering conversion
// commits; messages written before it are published in the order of seq.
// With dryRun nothing changes. Converting a table to the mode it has
// changes nothing and is not an error.
func (s *Store) ConvertOrdering(ctx context.Context, to Ordering, dryRun bool, lockTimeout time.Duration) (OrderingConversion, error) {
	db, err := s.pool()
	if err != nil {
		return OrderingConversion{}, err
	}
	if to != Unordered && to != OrderedByKey {
		return OrderingConversion{}, fmt.Errorf("outbox: ConvertOrdering: to must be Unordered or OrderedByKey (got %d)", int(to))
	}
	if err := checkLockTimeout("ConvertOrdering", lockTimeout); err != nil {
		return OrderingConversion{}, err
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return OrderingConversion{}, err
	}
	return ops.convertOrdering(ctx, db, to, dryRun, lockTimeout)
}

// convertOrdering is ConvertOrdering of a table of the rows layout: its
// order trigger created or dropped.
func (r rowsOps) convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, lockTimeout time.Duration) (OrderingConversion, error) {
	s := r.Store
	o, err := s.readOrder(ctx, db)
	if err != nil {
		return OrderingConversion{}, err
	}
	from := Unordered
	if o.ordered {
		from = OrderedByKey
	}
	s.order.observe(from)
	c := OrderingConversion{From: from, To: to}
	if to == OrderedByKey && from != to {
		// The trigger numbers rows from seq's sequence, which must be
		// there and must not cache numbers.
		if err := s.seqUnsafe(o, "seq"); err != nil {
			return c, err
		}
	}
	n, err := s.rows.Counts(ctx, db, math.MaxInt64)
	if err != nil {
		return c, fmt.Errorf("outbox: converting %s: counting its messages: %w", s.t.full, err)
	}
	c.Pending, c.Held = n.Ready+n.InFlight+n.Retrying+n.Held+n.Parked, n.Held
	if from == to {
		return c, nil
	}
	c.DDL = s.t.unorderTriggerSQL()
	if to == OrderedByKey {
		c.DDL = s.t.orderTriggerSQL()
	}
	if dryRun {
		return c, nil
	}
	if c.Took, err = convertIn(ctx, db, lockTimeout, c.DDL); err != nil {
		return c, fmt.Errorf("outbox: converting %s to %s: %w", s.t.full, to, err)
	}
	s.order.observe(to)
	return c, nil
}

// convertOrdering is ConvertOrdering of a table of the log layout. Under
// the table's claim lock (no claim runs meanwhile), making it ordered
// creates its order trigger and records the boundary: what its snapshot
// sees was written before the trigger and is relayed first, in the order
// of tx and seq; what it does not see has ord, and windows after it are
// relayed in the order of ord (see the claim function in logDDL). Making
// it unordered drops the trigger; the messages held behind failed ones
// are then claimed as they are due.
func (l logOps) convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, lockTimeout time.Duration) (OrderingConversion, error) {
	s := l.Store
	o, err := s.readOrderOf(ctx, db, "ord")
	if err != nil {
		return OrderingConversion{}, err
	}
	from := Unordered
	if o.ordered {
		from = OrderedByKey
	}
	s.order.observe(from)
	c := OrderingConversion{From: from, To: to}
	st, err := l.stats(ctx, db)
	if err != nil {
		return c, fmt.Errorf("outbox: converting %s: %w", s.t.full, err)
	}
	c.Pending, c.Held = st.Pending, st.Held
	if from == to {
		return c, nil
	}
	if to == OrderedByKey {
		if err := s.seqUnsafe(o, "ord"); err != nil {
			return c, err
		}
	}
	c.DDL = s.t.logUnorderDDL(l.l)
	if to == OrderedByKey {
		c.DDL = s.t.logOrderDDL(l.l)
	}
	if dryRun {
		return c, nil
	}
	// Under the claim lock: no claim runs meanwhile.
	lock := "SELECT pg_advisory_xact_lock(hashtextextended('" + strings.ReplaceAll(l.l.lockKey(), "'", "''") + "', 0))"
	if c.Took, err = convertIn(ctx, db, lockTimeout, lock, c.DDL); err != nil {
		return c, fmt.Errorf("outbox: converting %s to %s: %w", s.t.full, to, err)
	}
	s.order.observe(to)
	return c, nil
}

// convertIn runs stmts in one transaction whose locks wait at most
// lockTimeout, and returns how long it took (how long writers waited).
func convertIn(ctx context.Context, db *sql.DB, lockTimeout time.Duration, stmts ...string) (time.Duration, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	started := time.Now()
	stmts = append([]string{fmt.Sprintf("SET LOCAL lock_timeout = %d", max(lockTimeout.Milliseconds(), 1))}, stmts...)
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return time.Since(started), nil
}

// checkLockTimeout refuses a conversion's lockTimeout under a millisecond,
// PostgreSQL's unit of lock_timeout (which would silently round it).
func checkLockTimeout(op string, lockTimeout time.Duration) error {
	if lockTimeout < time.Millisecond {
		return fmt.Errorf("outbox: %s: lockTimeout must be at least 1ms (got %s): it bounds the wait for the writers in progress", op, lockTimeout)
	}
	return nil
}
