package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/dberr"
)

// Execer is what Add writes through: the caller's open transaction.
//
// Add accepts only values that prove they are a transaction by also having
// Commit() error and Rollback() error: *sql.Tx, GORM's transaction
// ConnPool (*sql.Tx, or *gorm.PreparedStmtTX with PrepareStmt), ent's
// generated *Tx with the sql/execquery feature, sqlx's *Tx. A *sql.DB or a
// *sql.Conn, which would commit each statement on its own, are refused with
// ErrNoTransaction, as is anything else that cannot show it is a
// transaction. For pgx's native pgx.Tx, use package pgxoutbox.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// transaction is what Add takes as proof that an Execer is a transaction.
type transaction interface {
	Commit() error
	Rollback() error
}

const insertColumns = 8 // id, event_type, event_key, exchange, routing_key, payload, content_type, headers

// KeyHeader is the AMQP header that carries Event.Key on the wire. An event
// may not set it among its Headers: the key goes in Event.Key, so that the
// table and the wire always agree.
const KeyHeader = "x-event-key"

// HeadersMaxBytes bounds an event's AMQP headers, Event.Key (sent as the
// KeyHeader) included, as they are encoded on the wire. AMQP sends all of
// a message's properties in one frame, and RabbitMQ closes the connection
// when that frame exceeds its frame_max (128 KiB by default): Add refuses
// larger headers with ErrInvalidEvent, leaving room for the other
// properties.
const HeadersMaxBytes = 64 << 10

// KeyMaxBytes is the longest Event.Key Add accepts. The rows layout indexes
// keys (with seq), and a B-tree entry holds at most 2,704 bytes: a longer
// key would fail the INSERT, and with it the caller's transaction, with
// PostgreSQL's "index row size exceeds btree maximum". Add refuses it first,
// with ErrInvalidEvent, in every mode and layout. Hash a longer natural key
// (the key names an aggregate; it need not be the aggregate).
const KeyMaxBytes = 2048

// NotBeforeMax is how far ahead Event.NotBefore may be: 366 days.
const NotBeforeMax = 366 * 24 * time.Hour

// keyLockSlots is how many slots the keys of an ordered table fall in, by
// their hash: a transaction that writes more than keyLocksMax keys takes
// whole slots for the others, so that it takes a bounded number of locks
// however many keys it writes (a lock per key ran out of shared memory at
// 15,000 keys).
const keyLockSlots = 1024

// Add writes events into the outbox through tx, the caller's open
// transaction, so that they are published if and only if that transaction
// commits. Add never uses the Store's own pool.
//
// tx must be a transaction (see Execer): anything else returns
// ErrNoTransaction and writes nothing. Every event is checked before
// anything is written; an event the broker could never take (no Type,
// invalid UTF-8 or NUL bytes in a text field, AMQP size limits, a
// KeyHeader among its headers) returns an error wrapping ErrInvalidEvent.
//
// Add writes all or nothing. Up to 100 events go out in one INSERT; more go
// in several, inside a savepoint that is rolled back if one of them fails
// (a cancelled ctx, say), so that a caller who commits after a failed Add
// never commits part of the events.
//
// On an ordered table (see OrderedByKey), whatever the store's
// configuration, the writers of one key take turns: each takes the key's
// turn for the rest of tx, the second waiting until the first commits or
// rolls back, and the table's trigger numbers the row only then. A turn is
// a transaction-scoped advisory lock: the key's own for the first 1,024
// keys of a transaction, and beyond those the lock of the key's slot (one
// of 1,024, by the key's hash), so that a transaction holds at most about
// 2,048 locks; writers of other keys wait only for a transaction that
// holds their key's slot that way.
// A message's place in the order of its key is therefore the order in
// which the writers' transactions took the key, which is also the order in
// which they committed; it does not depend on any clock. Add takes the
// keys of one call in a fixed order first (a store in ordered mode always;
// an unordered one when the call has several keys and the table is
// ordered), so one call never deadlocks by itself; a transaction that adds
// events of several keys in several calls can deadlock with another that
// adds them in the other order, and PostgreSQL then aborts one of them
// (SQLSTATE 40P01).
func (s *Store) Add(ctx context.Context, tx Execer, evts ...Event) error {
	_, err := s.AddIDs(ctx, tx, evts...)
	return err
}

// AddIDs is Add, and returns the ids of the messages it wrote, in the
// order of evts: each event's ID if set (in canonical form), else the
// UUIDv7 Add assigned. An ID that is not a UUID returns ErrInvalidEvent;
// one already in the table, or twice among evts, ErrDuplicateID.
func (s *Store) AddIDs(ctx context.Context, tx Execer, evts ...Event) ([]string, error) {
	if err := checkTransaction(tx); err != nil {
		return nil, err
	}
	if len(evts) == 0 {
		return nil, nil
	}
	var base map[string]string
	if s.headers != nil {
		base = s.headers(ctx)
	}
	// Every row is built, and so every event checked, before the first
	// INSERT: a bad event anywhere in the call writes nothing.
	args := make([]any, 0, len(evts)*insertColumns)
	var (
		delayed []any        // the rows of delayed events, and their delays
		now     = time.Now() // the writer's: NotBefore is a time on its clock
		keyed   []Event      // the events written into the table now (their keys take turns)
	)
	ids := make([]string, len(evts))
	seen := map[string]bool{}
	for i := range evts {
		row, err := s.rowArgs(&evts[i], base)
		delay := evts[i].NotBefore.Sub(now) // the zero time: far in the past, now
		if err == nil && delay > NotBeforeMax {
			err = fmt.Errorf("%w: %.60q event: NotBefore %s is %s ahead, more than NotBeforeMax (%s)", ErrInvalidEvent, evts[i].Type,
				evts[i].NotBefore.Format(time.RFC3339), delay.Round(time.Second), NotBeforeMax)
		}
		if err == nil && evts[i].ID != "" {
			if seen[row[0].(string)] {
				err = fmt.Errorf("%w: %s is the ID of two events of one call", ErrDuplicateID, row[0])
			}
			seen[row[0].(string)] = true
		}
		if err != nil {
			if len(evts) > 1 {
				return nil, fmt.Errorf("event %d of %d: %w", i+1, len(evts), err)
			}
			return nil, err
		}
		ids[i] = row[0].(string)
		if delay >= time.Microsecond {
			delayed = append(append(delayed, row[:]...), delay.Microseconds())
			continue
		}
		args = append(args, row[:]...)
		keyed = append(keyed, evts[i])
	}
	if err := s.st.lockKeys(ctx, tx, keyed); err != nil {
		return nil, err
	}
	var stmts []statement
	for start := 0; start < len(args); start += insertChunk * insertColumns {
		chunk := args[start:min(start+insertChunk*insertColumns, len(args))]
		stmts = append(stmts, statement{s.st.insertSQL(len(chunk) / insertColumns), chunk})
	}
	for start := 0; start < len(delayed); start += insertChunk * scheduleColumns {
		chunk := delayed[start:min(start+insertChunk*scheduleColumns, len(delayed))]
		stmts = append(stmts, statement{s.sched.scheduleSQL(len(chunk) / scheduleColumns), chunk})
	}
	if err := s.write(ctx, tx, len(evts), stmts); err != nil {
		if len(delayed) > 0 && dberr.Classify(err) == dberr.NoTable {
			err = fmt.Errorf("%w (delayed events wait in %s_scheduled: bring the table up to date with `outbox schema --apply`, Store.CreateSchemaIfAbsent or the migration 000002_scheduled)", err, s.t.full)
		}
		return nil, s.st.explainWrite(err)
	}
	if len(keyed) > 0 {
		s.Notify()
	}
	if len(delayed) > 0 {
		s.scheduledMayExist()
	}
	return ids, nil
}

// statement is one statement of a write and its arguments.
type statement struct {
	sql  string
	args []any
}

// write runs the statements of a call of Add: one as it is, more inside a
// savepoint, rolled back to when one fails, so that the call writes all
// its events or none whatever the caller does with the error.
func (s *Store) write(ctx context.Context, tx Execer, n int, stmts []statement) error {
	if len(stmts) == 1 {
		if _, err := tx.ExecContext(ctx, stmts[0].sql, stmts[0].args...); err != nil {
			return fmt.Errorf("outbox: writing %d event(s) into %s: %w", n, s.t.full, err)
		}
		return nil
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT outbox_add"); err != nil {
		return fmt.Errorf("outbox: writing %d events into %s: %w", n, s.t.full, err)
	}
	for _, st := range stmts {
		if _, err := tx.ExecContext(ctx, st.sql, st.args...); err != nil {
			err = fmt.Errorf("outbox: writing %d events into %s: %w", n, s.t.full, err)
			// The caller's context may be what failed: undo on one that
			// still works, briefly.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := tx.ExecContext(rctx, "ROLLBACK TO SAVEPOINT outbox_add"); rerr != nil {
				return fmt.Errorf("%w; undoing the events written so far failed too (%v): roll the transaction back", err, rerr)
			}
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT outbox_add"); err != nil {
		return fmt.Errorf("outbox: writing %d events into %s: %w", n, s.t.full, err)
	}
	return nil
}

// checkTransaction refuses what cannot be shown to be an open transaction.
func checkTransaction(tx Execer) error {
	if tx == nil {
		return fmt.Errorf("%w (got nil)", ErrNoTransaction)
	}
	if v := reflect.ValueOf(tx); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w (got a nil %T: did BeginTx fail?)", ErrNoTransaction, tx)
	}
	switch tx.(type) {
	case *sql.DB:
		return fmt.Errorf("%w (got a *sql.DB, which commits every statement on its own)", ErrNoTransaction)
	case *sql.Conn:
		return fmt.Errorf("%w (got a *sql.Conn, which commits every statement on its own; use conn.BeginTx)", ErrNoTransaction)
	case transaction:
		return nil
	}
	return fmt.Errorf("%w (%T has no Commit and Rollback methods, so it cannot be shown to be a transaction; pass the *sql.Tx itself, or pgxoutbox.Tx for pgx)", ErrNoTransaction, tx)
}

func (s *Store) rowArgs(e *Event, base map[string]string) ([insertColumns]any, error) {
	var row [insertColumns]any
	if e.Type == "" {
		return row, fmt.Errorf("%w: Type is empty; every event needs a type such as \"order.placed\"", ErrInvalidEvent)
	}
	exchange, key := s.router(*e)
	if e.Exchange != "" {
		exchange = e.Exchange
	}
	if e.RoutingKey != "" {
		key = e.RoutingKey
	}
	headers := e.Headers
	if len(base) > 0 {
		headers = make(map[string]string, len(base)+len(e.Headers))
		for k, v := range base {
			headers[k] = v
		}
		for k, v := range e.Headers {
			headers[k] = v
		}
	}
	if err := checkEvent(e, exchange, key, headers); err != nil {
		return row, err
	}
	encoded := []byte("{}")
	if len(headers) > 0 {
		var err error
		if encoded, err = json.Marshal(headers); err != nil {
			return row, fmt.Errorf("outbox: encoding headers of %q event: %w", e.Type, err)
		}
	}
	var id uuid.UUID
	if e.ID != "" {
		parsed, err := uuid.Parse(e.ID)
		if err != nil {
			return row, fmt.Errorf("%w: %.60q event: ID %.60q is not a UUID: %v", ErrInvalidEvent, e.Type, e.ID, err)
		}
		id = parsed
	} else {
		var err error
		if id, err = s.newID(); err != nil {
			return row, fmt.Errorf("outbox: generating message id: %w", err)
		}
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	row = [insertColumns]any{id.String(), e.Type, e.Key, exchange, key, payload, cmp.Or(e.ContentType, ContentTypeDefault), string(encoded)}
	return row, nil
}

// shortStrMax is the longest AMQP 0-9-1 short string: exchange and queue
// names, routing keys, message properties and header names.
const shortStrMax = 255

// checkEvent refuses, at write time where the error reaches the code that
// made it, an event the database or the broker could never take: text the
// database cannot store as it is (NUL bytes, invalid UTF-8, which JSON
// would silently replace), short strings over 255 bytes, headers larger
// than a frame.
func checkEvent(e *Event, exchange, key string, headers map[string]string) error {
	name := e.Type
	if !validText(name) {
		name = strings.ToValidUTF8(strings.ReplaceAll(name, "\x00", ""), "?")
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %.60q event: "+format, append([]any{ErrInvalidEvent, name}, args...)...)
	}
	for _, f := range []struct {
		what, v string
		short   bool
	}{
		{"Type", e.Type, true}, {"ContentType", e.ContentType, true}, {"exchange", exchange, true},
		{"routing key", key, true}, {"Key", e.Key, false},
	} {
		if !validText(f.v) {
			return bad("the %s is not valid UTF-8 text or holds a NUL byte", f.what)
		}
		if f.short && len(f.v) > shortStrMax {
			return bad("the %s is %d bytes; AMQP allows at most %d", f.what, len(f.v), shortStrMax)
		}
	}
	if len(e.Key) > KeyMaxBytes {
		return bad("the Key is %d bytes; at most %d (KeyMaxBytes), as PostgreSQL indexes it: hash a longer key", len(e.Key), KeyMaxBytes)
	}
	size := 4 // the table's length
	if e.Key != "" {
		size += 6 + len(KeyHeader) + len(e.Key)
	}
	for k, v := range headers {
		if fault := headerFault(k, v); fault != "" {
			return bad("%s", fault)
		}
		size += 6 + len(k) + len(v)
	}
	if size > HeadersMaxBytes {
		return bad("its headers and Key take %d bytes on the wire, more than the %d of HeadersMaxBytes (an AMQP frame carries them all); put large data in the Payload", size, HeadersMaxBytes)
	}
	return nil
}

// headerFault says why Add refuses a header, or "" when it does not. A
// claim sets aside a row written by SQL with such a header the same way
// (see Store.Claim).
func headerFault(k, v string) string {
	switch {
	case k == KeyHeader:
		return fmt.Sprintf("header %q is reserved for Event.Key; set Key instead", KeyHeader)
	case k == "":
		return "a header name is empty"
	case !validText(k):
		return fmt.Sprintf("header name %.40q is not valid UTF-8 text or holds a NUL byte", k)
	case !validText(v):
		return fmt.Sprintf("the value of header %.40q is not valid UTF-8 text or holds a NUL byte", k)
	case len(k) > shortStrMax:
		return fmt.Sprintf("header name %.40q… is %d bytes; AMQP allows at most %d", k, len(k), shortStrMax)
	}
	return ""
}

// validText reports whether PostgreSQL can store s as text unchanged.
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
