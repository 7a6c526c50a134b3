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
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

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
	// every depth; arrays element by element).
	Payload string
	// Headers must all be among the event's headers, with these values.
	Headers map[string]string
}

// Event is an event as the outbox table holds it.
type Event struct {
	ID, Type, Key, Exchange, RoutingKey, ContentType string
	Payload                                          []byte
	Headers                                          map[string]string
	Published                                        bool
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
		if err := json.Unmarshal([]byte(m.Payload), &want); err != nil {
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
			if e.Headers[k] != v {
				ok = false
			}
		}
		if ok && want != nil {
			var got any
			ok = json.Unmarshal(e.Payload, &got) == nil && Contains(got, want)
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// Contains reports whether got contains want, as decoded JSON values:
// objects as subsets at every depth, arrays element by element, other
// values equal.
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
	}
	return reflect.DeepEqual(got, want)
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

const eventsQuery = `SELECT id::text, event_type, event_key, exchange, routing_key, content_type, payload, headers::text, published_at IS NOT NULL
FROM %s ORDER BY seq, id`

type sqlQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type pgxQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// read returns the events of table that src sees.
func read(ctx context.Context, src any, table string) ([]Event, error) {
	t, err := sqlident.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("%w name %v", outbox.ErrInvalidTable, err)
	}
	q := fmt.Sprintf(eventsQuery, t.Quoted)
	type scanner interface {
		Next() bool
		Scan(dest ...any) error
		Err() error
	}
	var (
		rows scanner
		done func()
	)
	switch s := src.(type) {
	case nil:
		return nil, fmt.Errorf("nothing to read %s with (nil)", table)
	case sqlQuerier:
		r, err := s.QueryContext(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", table, err)
		}
		rows, done = r, func() { r.Close() }
	case pgxQuerier:
		r, err := s.Query(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", table, err)
		}
		rows, done = r, r.Close
	default:
		return nil, fmt.Errorf("cannot read %s with a %T: pass a *sql.Tx or *sql.DB (GORM: tx.Statement.ConnPool; ent: a Tx generated with sql/execquery) or a pgx.Tx, *pgx.Conn or *pgxpool.Pool", table, src)
	}
	defer done()
	var out []Event
	for rows.Next() {
		var (
			e       Event
			headers string
		)
		if err := rows.Scan(&e.ID, &e.Type, &e.Key, &e.Exchange, &e.RoutingKey, &e.ContentType, &e.Payload, &headers, &e.Published); err != nil {
			return nil, fmt.Errorf("reading %s: %w", table, err)
		}
		if len(headers) > 2 {
			if err := json.Unmarshal([]byte(headers), &e.Headers); err != nil {
				return nil, fmt.Errorf("reading %s: headers of %s: %w", table, e.ID, err)
			}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	return out, nil
}
