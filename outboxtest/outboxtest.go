// Package outboxtest helps an application test its own use of the outbox,
// in the style of River's rivertest: assert that the code under test
// recorded an event (or did not), inside the test's transaction or after
// its commit; run the relay's work in-process into a recording publisher,
// without RabbitMQ; and hand an inbox a delivery, as many times as the
// broker might, to see its effect applied once.
//
//	tx, _ := db.BeginTx(ctx, nil)
//	placeOrder(ctx, tx, order) // the code under test, writing through tx
//	outboxtest.RequireEvent(t, tx, "outbox", outboxtest.Match{
//		Type: "order.placed", Key: "order-42", Payload: `{"total": 4200}`,
//	})
//
// Events are read from anything that queries: a *sql.Tx or *sql.DB (and so
// GORM's tx.Statement.ConnPool, ent's Tx with the sql/execquery feature)
// or a pgx connection, pool or transaction. A transaction sees what it
// wrote before its commit; a pool sees what was committed.
package outboxtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/sqlident"
)

// Match selects events; a zero field matches anything.
type Match struct {
	Type       string
	Key        string
	Exchange   string
	RoutingKey string
	// Payload is JSON that the event's payload must contain: every field
	// it names, with the same value (objects are matched as subsets, at
	// every depth; arrays element by element; numbers by value, exactly).
	// "null" matches only a payload that is JSON null.
	Payload string
	// Headers must all be among the event's headers, with these values
	// (a header given with the value "" must be present, empty).
	Headers map[string]string
}

// Event is an event as the outbox table holds it.
type Event struct {
	ID, Type, Key, Exchange, RoutingKey, ContentType string
	Payload                                          []byte
	Headers                                          map[string]string
	Published                                        bool
	// NotBefore is when a delayed event (outbox.Event.NotBefore) is due,
	// by the database's clock, while it waits beside the table; zero for
	// an event in the table. Delayed events come after the others, the
	// soonest due first.
	NotBefore time.Time
}

// Find returns the events of table that src sees and that match m, in the
// order they were written: what the Require functions check, for code
// that has no testing.TB (an Example, a helper of your own).
func Find(ctx context.Context, src any, table string, m Match) ([]Event, error) {
	all, err := read(ctx, src, table)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: %w", err)
	}
	got, err := filter(all, m)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: %w", err)
	}
	return got, nil
}

// Events returns every event of table that src sees, in the order they
// were written.
func Events(tb testing.TB, src any, table string) []Event {
	tb.Helper()
	evts, err := read(context.Background(), src, table)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return evts
}

// RequireEvent fails the test unless exactly one event of table matches m,
// and returns it. The failure lists what was recorded.
func RequireEvent(tb testing.TB, src any, table string, m Match) Event {
	tb.Helper()
	return RequireEvents(tb, src, table, m, 1)[0]
}

// RequireEvents fails the test unless exactly n events of table match m,
// and returns them.
func RequireEvents(tb testing.TB, src any, table string, m Match, n int) []Event {
	tb.Helper()
	all := Events(tb, src, table)
	got, err := filter(all, m)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	if len(got) != n {
		tb.Fatalf("outboxtest: want %d event(s) matching %s in %s, found %d; recorded:\n%s", n, m, table, len(got), listing(all))
	}
	return got
}

// RequireNoEvent fails the test if an event of table matches m.
func RequireNoEvent(tb testing.TB, src any, table string, m Match) {
	tb.Helper()
	all := Events(tb, src, table)
	got, err := filter(all, m)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	if len(got) > 0 {
		tb.Fatalf("outboxtest: want no event matching %s in %s, found %d; recorded:\n%s", m, table, len(got), listing(all))
	}
}

func (m Match) String() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", name, v))
		}
	}
	add("type", m.Type)
	add("key", m.Key)
	add("exchange", m.Exchange)
	add("routing key", m.RoutingKey)
	add("payload", m.Payload)
	if len(m.Headers) > 0 {
		parts = append(parts, fmt.Sprintf("headers=%v", m.Headers))
	}
	if len(parts) == 0 {
		return "{anything}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func filter(all []Event, m Match) ([]Event, error) {
	var want any
	if m.Payload != "" {
		var err error
		if want, err = decodeJSON([]byte(m.Payload)); err != nil {
			return nil, fmt.Errorf("Match.Payload is not JSON: %v", err)
		}
	}
	var out []Event
	for _, e := range all {
		if (m.Type != "" && e.Type != m.Type) || (m.Key != "" && e.Key != m.Key) ||
			(m.Exchange != "" && e.Exchange != m.Exchange) || (m.RoutingKey != "" && e.RoutingKey != m.RoutingKey) {
			continue
		}
		ok := true
		for k, v := range m.Headers {
			if got, has := e.Headers[k]; !has || got != v {
				ok = false
			}
		}
		if ok && m.Payload != "" {
			got, err := decodeJSON(e.Payload)
			ok = err == nil && Contains(got, want)
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// decodeJSON decodes one JSON value, its numbers as json.Number, so that
// they compare exactly: as float64, 12345678901234567891 would equal
// 12345678901234567890.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// Contains reports whether got contains want, as decoded JSON values:
// objects as subsets at every depth, arrays element by element, other
// values equal (null only to null). Numbers compare by value, exactly:
// decode with json.Decoder.UseNumber to keep large integers and long
// fractions whole (a float64 keeps 15 to 17 digits).
func Contains(got, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok || !Contains(gv, wv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !Contains(g[i], w[i]) {
				return false
			}
		}
		return true
	case json.Number, float64:
		wn, gn := number(w), number(got)
		return wn != nil && gn != nil && wn.Cmp(gn) == 0
	}
	return reflect.DeepEqual(got, want)
}

// number returns v's exact value when it is a decoded JSON number, nil
// otherwise.
func number(v any) *big.Rat {
	switch n := v.(type) {
	case json.Number:
		if r, ok := new(big.Rat).SetString(n.String()); ok {
			return r
		}
	case float64:
		if !math.IsInf(n, 0) && !math.IsNaN(n) {
			return new(big.Rat).SetFloat64(n)
		}
	}
	return nil
}

// listing prints events for a failure message, one a line.
func listing(all []Event) string {
	if len(all) == 0 {
		return "  (no events)"
	}
	var b strings.Builder
	for i, e := range all {
		state := "pending"
		if e.Published {
			state = "published"
		}
		fmt.Fprintf(&b, "  %d. %s key=%q exchange=%q routing_key=%q %s payload=%s", i+1, e.Type, e.Key, e.Exchange, e.RoutingKey, state, e.Payload)
		if len(e.Headers) > 0 {
			fmt.Fprintf(&b, " headers=%v", e.Headers)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// eventsQuery reads the events of a table of the rows layout, or of the
// view of a table of the log layout (its events with their state, in the
// columns of the rows layout).
const eventsQuery = `SELECT id::text, event_type, event_key, exchange, routing_key, content_type, payload, headers::text, published_at IS NOT NULL
FROM %s ORDER BY seq, id`

// scheduledQuery reads the delayed events waiting beside a table, the
// soonest due first.
const scheduledQuery = `SELECT id::text, event_type, event_key, exchange, routing_key, content_type, payload, headers::text, due
FROM %s ORDER BY due, id`

// layoutQuery says what the table is, as the store reads it, without a
// statement that can fail (which would abort the caller's transaction):
// whether it exists and is a plain table, whether it has the rows
// layout's published_at column, and whether the log layout's marker and
// view exist.
const layoutQuery = `SELECT c.relkind::text,
	EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = 'published_at' AND NOT attisdropped),
	to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL
FROM (SELECT to_regclass($1) AS oid) AS r LEFT JOIN pg_class AS c ON c.oid = r.oid`

type sqlQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type pgxQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type scanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// query runs q through src; done closes the rows.
func query(ctx context.Context, src any, table, q string, args ...any) (rows scanner, done func(), err error) {
	switch s := src.(type) {
	case nil:
		return nil, nil, fmt.Errorf("nothing to read %s with (nil)", table)
	case sqlQuerier:
		r, err := s.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", table, err)
		}
		return r, func() { r.Close() }, nil
	case pgxQuerier:
		r, err := s.Query(ctx, q, args...)
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", table, err)
		}
		return r, r.Close, nil
	}
	return nil, nil, fmt.Errorf("cannot read %s with a %T: pass a *sql.Tx or *sql.DB (GORM: tx.Statement.ConnPool; ent: a Tx generated with sql/execquery) or a pgx.Tx, *pgx.Conn or *pgxpool.Pool", table, src)
}

// relation returns the relation that holds t's events in the columns of
// the rows layout: the table itself (rows layout) or its view (log
// layout), found as the store finds the layout.
func relation(ctx context.Context, src any, table string, t sqlident.Table) (string, error) {
	meta, view := beside(t, "_log"), beside(t, "_messages")
	rows, done, err := query(ctx, src, table, layoutQuery, t.Quoted, meta, view)
	if err != nil {
		return "", err
	}
	defer done()
	var (
		kind                  sql.NullString
		hasRows, hasMeta, has bool
	)
	if rows.Next() {
		err = rows.Scan(&kind, &hasRows, &hasMeta, &has)
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return "", fmt.Errorf("reading the layout of %s: %w", table, err)
	}
	switch {
	case !kind.Valid:
		return "", fmt.Errorf("table %s does not exist (or is not visible to this connection): create it with `outbox schema` (or Store.CreateSchemaIfAbsent)", table)
	case hasMeta && kind.String == "p" && has:
		return view, nil
	case hasMeta && kind.String == "p":
		return "", fmt.Errorf("%w: %s has the log layout but no view %s: bring it up to date with `outbox schema --layout log --apply` (Store.CreateLogSchemaIfAbsent)", outbox.ErrInvalidTable, table, view)
	case hasRows && kind.String == "r":
		return t.Quoted, nil
	}
	return "", fmt.Errorf("%w: %s is neither an outbox table of the rows layout (no published_at column) nor one of the log layout (no %s table): is it an outbox table?", outbox.ErrInvalidTable, table, meta)
}

// read returns the events of table that src sees.
func read(ctx context.Context, src any, table string) ([]Event, error) {
	t, err := sqlident.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("%w name %v", outbox.ErrInvalidTable, err)
	}
	rel, err := relation(ctx, src, table, t)
	if err != nil {
		return nil, err
	}
	out, err := readEvents(ctx, src, table, fmt.Sprintf(eventsQuery, rel), false)
	if err != nil {
		return nil, err
	}
	sched, ok, err := scheduledOf(ctx, src, table, t)
	if err != nil || !ok {
		return out, err
	}
	delayed, err := readEvents(ctx, src, table, fmt.Sprintf(scheduledQuery, sched), true)
	return append(out, delayed...), err
}

// readEvents reads the events q selects (eventsQuery's columns, then, when
// delayed, the due time).
func readEvents(ctx context.Context, src any, table, q string, delayed bool) ([]Event, error) {
	rows, done, err := query(ctx, src, table, q)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []Event
	for rows.Next() {
		var (
			e       Event
			headers string
		)
		dest := []any{&e.ID, &e.Type, &e.Key, &e.Exchange, &e.RoutingKey, &e.ContentType, &e.Payload, &headers}
		if delayed {
			dest = append(dest, &e.NotBefore)
		} else {
			dest = append(dest, &e.Published)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("reading %s: %w", table, err)
		}
		if e.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("reading %s: headers of %s: %w", table, e.ID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	return out, nil
}

// beside names, quoted and in t's schema, the object of t's name with
// suffix: the tables and view beside an outbox table.
func beside(t sqlident.Table, suffix string) string {
	name := `"` + t.Name + suffix + `"`
	if schema, _, ok := strings.Cut(t.Quoted, "."); ok {
		return schema + "." + name
	}
	return name
}

// scheduledOf returns the table of t's delayed messages, quoted, and
// whether it exists (a table of a version before delayed delivery has
// none), without a statement that can fail.
func scheduledOf(ctx context.Context, src any, table string, t sqlident.Table) (string, bool, error) {
	name := beside(t, "_scheduled")
	var ok bool
	if err := queryOne(ctx, src, table, &ok, `SELECT to_regclass($1) IS NOT NULL`, name); err != nil {
		return "", false, fmt.Errorf("reading %s: %w", table, err)
	}
	return name, ok, nil
}

// queryOne runs q through src and scans the one value of its one row
// into dest.
func queryOne(ctx context.Context, src any, table string, dest any, q string, args ...any) error {
	rows, done, err := query(ctx, src, table, q, args...)
	if err != nil {
		return err
	}
	defer done()
	if rows.Next() {
		err = rows.Scan(dest)
	}
	if err == nil {
		err = rows.Err()
	}
	return err
}

// MakeDue makes the delayed events of table that are due within d due now,
// as if d had passed: the next Drain (or Store.Maintain) moves them into
// the table, a relay's Store.MoveDue within a second, and a test of what happens
// "tomorrow" needs no sleep. src must be able to write (a *sql.DB, *sql.Tx
// or pgx connection); it returns how many it made due.
func MakeDue(ctx context.Context, src any, table string, d time.Duration) (int64, error) {
	t, err := sqlident.ParseTable(table)
	if err != nil {
		return 0, fmt.Errorf("outboxtest: %w name %v", outbox.ErrInvalidTable, err)
	}
	sched, ok, err := scheduledOf(ctx, src, table, t)
	if err != nil || !ok {
		return 0, err
	}
	var n int64
	if err := queryOne(ctx, src, table, &n, `WITH due AS (UPDATE `+sched+` SET due = now()
WHERE last_error IS NULL AND due <= now() + $1::bigint * interval '1 microsecond' RETURNING 1) SELECT count(*) FROM due`, d.Microseconds()); err != nil {
		return 0, fmt.Errorf("outboxtest: making the delayed events of %s due: %w", table, err)
	}
	return n, nil
}

// decodeHeaders decodes a row's headers: a value that is not a string (a
// row written by SQL, which the relay parks) is kept as its JSON text, so
// that a test can still see the row.
func decodeHeaders(s string) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, err
	}
	if len(raw) == 0 {
		return nil, nil
	}
	h := make(map[string]string, len(raw))
	for k, v := range raw {
		var str string
		if json.Unmarshal(v, &str) == nil {
			h[k] = str
		} else {
			h[k] = string(v)
		}
	}
	return h, nil
}
