package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/dberr"
)

// Delayed messages (Event.NotBefore) wait beside the table, in
// <table>_scheduled, until they are due; Store.Maintain then moves them
// into the table in one statement, as a writer would write them at that
// moment (a new seq, and on an ordered table their key's next place). So
// the table and its claims, of either PostgreSQL layout and on MySQL, never
// see a message that is not due: a claim costs what it costs without them,
// and the log layout's events table stays insert-only. What a delayed
// message changes is the scheduled table's rows, never the traffic's.

// scheduleColumns are the columns of a delayed row: the eight of the
// INSERT, then its delay in microseconds from the database's now.
const scheduleColumns = insertColumns + 1

// promoteBatch is how many due messages one statement moves; a call of
// MoveDue moves up to promoteRounds of those.
const (
	promoteBatch  = 1000
	promoteRounds = 5
)

// dueLook is how long after a look at its scheduled table MoveDue looks
// again, even before the next due time it knows of: another process may
// have written a message due sooner.
const dueLook = time.Second

// scheduleRecheck is how long a store that found no scheduled table (one
// created by a version before delayed delivery) waits to look again.
const scheduleRecheck = time.Minute

// refusedReason is what a due message whose ID was written into the table
// meanwhile says, kept in the scheduled table for an operator.
const refusedReason = "not moved into the table when due: a message of the same ID was written there meanwhile"

// scheduledTable names the table of delayed messages of t.
func (t table) scheduledTable() string { return t.qualified(t.name + "_scheduled") }

// scheduledSQL creates the table of delayed messages (PostgreSQL, either
// layout): migration 000002 of the log layout, 000003 of the rows layout.
func (t table) scheduledSQL() string {
	return strings.NewReplacer("{scheduled}", t.scheduledTable(), "{name}", t.name).Replace(`-- Messages written with a delay (Event.NotBefore), until they are due:
-- Store.Maintain (a relay, every 100ms) moves them into the table then.
-- last_error is set on one it could not move (its ID was written into
-- the table meanwhile): it stays here for an operator.
CREATE TABLE IF NOT EXISTS {scheduled} (
    id            uuid        PRIMARY KEY,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL DEFAULT '',
    exchange      text        NOT NULL DEFAULT '',
    routing_key   text        NOT NULL DEFAULT '',
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    due           timestamptz NOT NULL,
    last_error    text
);

CREATE INDEX IF NOT EXISTS "{name}_scheduled_due_idx" ON {scheduled} (due)
    WHERE last_error IS NULL;
`)
}

// dropScheduledSQL drops it (the down migration).
func (t table) dropScheduledSQL() string {
	return "DROP TABLE IF EXISTS " + t.scheduledTable() + ";\n"
}

// pgPromoteSQL moves up to $1 due messages into the table, each of its
// keys' messages in the order they fell due, keys in sorted order (the
// order a writer in ordered mode takes their turns in), and sets aside
// those whose ID is in the table already. It returns how many of each,
// and how far from now the next of the others is due, in microseconds
// (NULL: none; the first entry of the due index past those it moved).
const pgPromoteSQL = `WITH due AS (
    SELECT s.id FROM {scheduled} AS s
    WHERE s.due <= now() AND s.last_error IS NULL
    ORDER BY s.due LIMIT $1 FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM {scheduled} AS s USING due
    WHERE s.id = due.id AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.id = s.id)
    RETURNING s.*
), moved AS (
    INSERT INTO {table} (id, event_type, event_key, exchange, routing_key, payload, content_type, headers)
    SELECT id, event_type, event_key, exchange, routing_key, payload, content_type, headers FROM taken
    ORDER BY event_key, due, created_at, id
    RETURNING 1
), refused AS (
    UPDATE {scheduled} AS s SET last_error = $2
    FROM due WHERE s.id = due.id AND EXISTS (SELECT 1 FROM {table} AS t WHERE t.id = s.id)
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM refused),
    (SELECT floor(extract(epoch FROM s.due - now()) * 1000000)::bigint FROM {scheduled} AS s
     WHERE s.last_error IS NULL AND s.id NOT IN (SELECT id FROM due) ORDER BY s.due LIMIT 1)`

// pgNextDueSQL says how far from now the next delayed message is due, in
// microseconds (no row: none), by the index on due.
const pgNextDueSQL = `SELECT floor(extract(epoch FROM s.due - now()) * 1000000)::bigint FROM {scheduled} AS s
WHERE s.last_error IS NULL ORDER BY s.due LIMIT 1`

// pgScheduledCountSQL counts the delayed messages (up to $1; those that
// could not be moved too) and says how far from now the next is due, in
// microseconds (NULL: none).
const pgScheduledCountSQL = `SELECT (SELECT count(*) FROM (SELECT 1 FROM {scheduled} LIMIT $1) AS c),
    (SELECT floor(extract(epoch FROM min(due) - now()) * 1000000)::bigint FROM {scheduled} WHERE last_error IS NULL)`

// pgListScheduledSQL lists up to $1 delayed messages of type $2 and key $3
// (each empty for any), due after the message ($4, $5) (due in microseconds
// since the epoch, 0 for the first), by their due index.
const pgListScheduledSQL = `SELECT id::text, event_type, event_key, exchange, routing_key, payload, content_type, headers::text,
	created_at, due, coalesce(last_error, '')
FROM {scheduled}
WHERE ($2 = '' OR event_type = $2) AND ($3 = '' OR event_key = $3)
  AND ($4::bigint = 0 OR (due, id) > (to_timestamp(0) + $4::bigint * interval '1 microsecond', $5::uuid))
ORDER BY due, id LIMIT $1`

// scheduler is what a Store does with delayed messages, in its database's
// SQL: PostgreSQL's (either layout) or a backend's.
type scheduler interface {
	// scheduleSQL writes n delayed rows (scheduleColumns each).
	scheduleSQL(n int) string
	// promote moves up to n due messages into the table, and says how
	// far ahead the next is due (backend.NoneDue: none; 0: perhaps now).
	promote(ctx context.Context, db *sql.DB, n int) (moved, refused int64, next time.Duration, err error)
	// scheduled counts the delayed messages, up to limit, and how far
	// ahead the next is due (ok false: none).
	scheduled(ctx context.Context, db *sql.DB, limit int64) (n int64, next time.Duration, ok bool, err error)
	// list lists up to limit of them, the soonest due first.
	list(ctx context.Context, db *sql.DB, q backend.ScheduledQuery) ([]backend.Row, error)
	// change makes those among ids due now, or deletes them.
	change(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error)
}

// pgScheduler is scheduler on PostgreSQL.
type pgScheduler struct {
	t        table
	promoteQ string
	nextQ    string
	countQ   string
	listQ    string

	mu   sync.Mutex
	sqls map[int]string
}

func newPGScheduler(t table) *pgScheduler {
	r := strings.NewReplacer("{scheduled}", t.scheduledTable(), "{table}", t.quoted)
	return &pgScheduler{t: t, promoteQ: r.Replace(pgPromoteSQL), nextQ: r.Replace(pgNextDueSQL), countQ: r.Replace(pgScheduledCountSQL),
		listQ: r.Replace(pgListScheduledSQL), sqls: map[int]string{}}
}

func (p *pgScheduler) scheduleSQL(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := p.sqls[n]; q != "" {
		return q
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + p.t.scheduledTable() + " (id, event_type, event_key, exchange, routing_key, payload, content_type, headers, due) VALUES ")
	for r := range n {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := range insertColumns {
			b.WriteString("$" + strconv.Itoa(r*scheduleColumns+c+1))
			if c == insertColumns-1 {
				b.WriteString("::jsonb")
			}
			b.WriteByte(',')
		}
		// clock_timestamp(), not now(): now() is when the writer's
		// transaction began, before Add measured the delay, and a message
		// due then went out that much before its NotBefore.
		b.WriteString("clock_timestamp() + $" + strconv.Itoa(r*scheduleColumns+scheduleColumns) + "::bigint * interval '1 microsecond')")
	}
	p.sqls[n] = b.String()
	return p.sqls[n]
}

func (p *pgScheduler) promote(ctx context.Context, db *sql.DB, n int) (moved, refused int64, next time.Duration, err error) {
	// Most looks find nothing due: the scheduled table's index says so
	// at the cost of a read, where the statement that moves them plans an
	// insert into the table (on the log layout, into a partitioned table:
	// a lock on each partition).
	var until sql.NullInt64
	switch err := db.QueryRowContext(ctx, p.nextQ).Scan(&until); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, 0, backend.NoneDue, nil
	case err != nil:
		return 0, 0, 0, err
	case until.Int64 > 0:
		return 0, 0, time.Duration(until.Int64) * time.Microsecond, nil
	}
	if err = db.QueryRowContext(ctx, p.promoteQ, n, refusedReason).Scan(&moved, &refused, &until); err != nil {
		return 0, 0, 0, err
	}
	next = backend.NoneDue
	if until.Valid {
		next = max(time.Duration(until.Int64)*time.Microsecond, 0)
	}
	return moved, refused, next, nil
}

func (p *pgScheduler) scheduled(ctx context.Context, db *sql.DB, limit int64) (int64, time.Duration, bool, error) {
	var (
		n    int64
		next sql.NullInt64
	)
	if err := db.QueryRowContext(ctx, p.countQ, limit).Scan(&n, &next); err != nil {
		return 0, 0, false, err
	}
	return n, time.Duration(next.Int64) * time.Microsecond, next.Valid, nil
}

// backendScheduler is scheduler on a backend's database.
type backendScheduler struct{ be backend.Backend }

func (b backendScheduler) scheduleSQL(n int) string { return b.be.ScheduleSQL(n) }

func (b backendScheduler) promote(ctx context.Context, db *sql.DB, n int) (moved, refused int64, next time.Duration, err error) {
	return b.be.Promote(ctx, db, n, refusedReason)
}

func (b backendScheduler) scheduled(ctx context.Context, db *sql.DB, limit int64) (int64, time.Duration, bool, error) {
	return b.be.Scheduled(ctx, db, limit)
}

func (b backendScheduler) list(ctx context.Context, db *sql.DB, q backend.ScheduledQuery) ([]backend.Row, error) {
	return b.be.ListScheduled(ctx, db, q)
}

func (b backendScheduler) change(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	return b.be.ChangeScheduled(ctx, db, discard, ids)
}

func (p *pgScheduler) list(ctx context.Context, db *sql.DB, q backend.ScheduledQuery) ([]backend.Row, error) {
	after := cmp.Or(q.AfterID, "00000000-0000-0000-0000-000000000000")
	rows, err := db.QueryContext(ctx, p.listQ, q.Limit, q.EventType, q.Key, q.AfterDue, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []backend.Row
	for rows.Next() {
		var (
			r       backend.Row
			headers string
		)
		if err := rows.Scan(&r.ID, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &headers,
			&r.CreatedAt, &r.Due, &r.LastError); err != nil {
			return nil, err
		}
		r.Headers = []byte(headers)
		out = append(out, r)
	}
	return out, rows.Err()
}

func (p *pgScheduler) change(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	q := `UPDATE ` + p.t.scheduledTable() + ` SET due = now(), last_error = NULL WHERE id = ANY($1::uuid[])`
	if discard {
		q = `DELETE FROM ` + p.t.scheduledTable() + ` WHERE id = ANY($1::uuid[])`
	}
	res, err := db.ExecContext(ctx, q, ids)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Scheduled returns up to limit delayed messages (Event.NotBefore) that
// wait beside the table, the soonest due first, each with its NotBefore
// (when it is due, by the database's clock) and, for one Maintain could
// not move into the table (a message of its ID was written there
// meanwhile), its LastError.
func (s *Store) Scheduled(ctx context.Context, limit int) ([]Message, error) {
	if limit < 1 {
		return nil, fmt.Errorf("outbox: Scheduled: limit must be at least 1 (got %d)", limit)
	}
	return s.findScheduled(ctx, backend.ScheduledQuery{Limit: limit})
}

// ScheduledQuery selects delayed messages for FindScheduled. Its empty
// fields match every message.
type ScheduledQuery struct {
	// Limit is the most messages returned (at least 1, at most
	// ScheduledQueryMax).
	Limit int
	// EventType and Key, when set, match exactly.
	EventType, Key string
	// After, when set, is the last message of the previous page (as
	// FindScheduled returned it): the page starts after it.
	After *Message
}

// ScheduledQueryMax is the largest ScheduledQuery.Limit.
const ScheduledQueryMax = 1000

// FindScheduled returns the delayed messages q selects, the soonest due
// first (by NotBefore, then ID), a page at a time: pass the last message
// of a page as the next query's After. Each page reads from where the
// last ended (by the table of delayed messages' index of due times on
// PostgreSQL), so that a late page costs what the first does.
func (s *Store) FindScheduled(ctx context.Context, q ScheduledQuery) ([]Message, error) {
	if q.Limit < 1 || q.Limit > ScheduledQueryMax {
		return nil, fmt.Errorf("outbox: FindScheduled: limit must be 1 to %d (got %d)", ScheduledQueryMax, q.Limit)
	}
	bq := backend.ScheduledQuery{Limit: q.Limit, EventType: q.EventType, Key: q.Key}
	if q.After != nil {
		if q.After.NotBefore.IsZero() || q.After.ID == "" {
			return nil, fmt.Errorf("outbox: FindScheduled: After is not a delayed message (its NotBefore or ID is empty)")
		}
		bq.AfterDue, bq.AfterID = q.After.NotBefore.UnixMicro(), q.After.ID
	}
	return s.findScheduled(ctx, bq)
}

func (s *Store) findScheduled(ctx context.Context, q backend.ScheduledQuery) ([]Message, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	rows, err := s.sched.list(ctx, db, q)
	switch {
	case dberr.Classify(err) == dberr.NoTable:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("outbox: listing the delayed messages of %s: %w", s.t.full, err)
	}
	return fromRows(rows), nil
}

// PublishNow makes the delayed messages among ids due now: a relay moves
// them into the table within a second (at once when it runs with this
// Store), and they go out. One that could not be moved (its ID was written
// into the table meanwhile) is tried again. Ids that are not delayed
// messages are ignored. It returns how many it made due.
func (s *Store) PublishNow(ctx context.Context, ids ...string) (int64, error) {
	return s.changeScheduled(ctx, "PublishNow", "making delayed messages due", false, ids)
}

// DiscardScheduled deletes the delayed messages among ids: they are never
// published. Ids that are not delayed messages are ignored. It returns
// how many it deleted.
func (s *Store) DiscardScheduled(ctx context.Context, ids ...string) (int64, error) {
	return s.changeScheduled(ctx, "DiscardScheduled", "discarding delayed messages", true, ids)
}

func (s *Store) changeScheduled(ctx context.Context, op, what string, discard bool, ids []string) (int64, error) {
	db, err := s.pool()
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	canon := make([]string, len(ids))
	for i, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil {
			return 0, fmt.Errorf("outbox: %s: %q is not a message id (a UUID)", op, id)
		}
		canon[i] = u.String()
	}
	n, err := s.sched.change(ctx, db, discard, canon)
	switch {
	case dberr.Classify(err) == dberr.NoTable:
		return 0, nil
	case err != nil:
		return n, fmt.Errorf("outbox: %s in %s: %w", what, s.t.full, err)
	}
	if n > 0 && !discard {
		s.scheduledMayExist()
	}
	return n, nil
}

// MoveDue moves the delayed messages that have fallen due (Event.NotBefore)
// into the table, as a writer would write them at that moment, and wakes
// this process's relays when it moved some. It returns when the next
// delayed message it knows of is due (zero: none): call it again then,
// and every second or so besides, since another process may write one due
// sooner. A call less than a second after the last one that looked, and
// before that due time, returns at once without a statement. While
// something calls it, Maintain leaves this work to it.
//
// A relay calls it from a goroutine of its own: a delayed message goes out
// about when it is due, within about a second of it when another process
// wrote it due sooner than any the relay knew of, and never before.
func (s *Store) MoveDue(ctx context.Context) (time.Time, error) {
	db, err := s.pool()
	if err != nil {
		return time.Time{}, err
	}
	s.moverAt.Store(time.Now().UnixNano())
	return s.moveDue(ctx, db, false)
}

// moveDue is MoveDue on db; unless always, s.lookAt gates it.
func (s *Store) moveDue(ctx context.Context, db *sql.DB, always bool) (time.Time, error) {
	now := time.Now()
	if now.UnixNano() < s.schedAbsentUntil.Load() || (now.UnixNano() < s.lookAt.Load() && !always) {
		return unixTime(s.nextDueAt.Load()), nil
	}
	var (
		moved int64
		next  time.Duration
	)
	for range promoteRounds {
		m, refused, until, err := s.sched.promote(ctx, db, promoteBatch)
		if dberr.Classify(err) == dberr.NoTable {
			s.schedAbsentUntil.Store(time.Now().Add(scheduleRecheck).UnixNano())
			return time.Time{}, nil
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("outbox: moving the due delayed messages into %s: %w", s.t.full, err)
		}
		if refused > 0 {
			s.logger.WarnContext(ctx, "outbox: delayed messages not moved into the table when due: their IDs were written there meanwhile; they stay in the scheduled table",
				slog.String("table", s.t.full), slog.Int64("count", refused))
		}
		moved, next = moved+m, until
		if m+refused < promoteBatch {
			break
		}
		next = 0 // a full batch: more may be due
	}
	if moved > 0 {
		s.Notify()
	}
	now = time.Now()
	var due int64 // unix ns; 0: none known
	if next != backend.NoneDue {
		due = now.Add(next).UnixNano()
	}
	s.nextDueAt.Store(due)
	s.lookAt.Store(now.Add(min(next, s.dueLook)).UnixNano())
	return unixTime(due), nil
}

// unixTime is the time of ns nanoseconds since the epoch; zero for 0.
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// moverIdle is how long after the last call of MoveDue Maintain takes its
// work over: longer than a relay ever waits between two calls.
const moverIdle = 10 * time.Minute

// moveDueIfNoMover is Maintain's part: MoveDue's work, unless something
// calls MoveDue. It looks whatever MoveDue last learnt, so that a delayed
// message made due by other means (outboxtest.MakeDue, another process)
// is moved by the next call.
func (s *Store) moveDueIfNoMover(ctx context.Context, db *sql.DB) error {
	if time.Since(time.Unix(0, s.moverAt.Load())) < moverIdle {
		return nil
	}
	_, err := s.moveDue(ctx, db, true)
	return err
}

// scheduledCounts reads Stats' and Gauges' Scheduled and NextDue; a table
// without a scheduled table has none.
func (s *Store) scheduledCounts(ctx context.Context, db *sql.DB, limit int64) (n int64, next time.Time, err error) {
	n, until, ok, err := s.sched.scheduled(ctx, db, limit)
	switch {
	case dberr.Classify(err) == dberr.NoTable:
		return 0, time.Time{}, nil
	case err != nil:
		return 0, time.Time{}, fmt.Errorf("outbox: counting the delayed messages of %s: %w", s.t.full, err)
	case ok:
		next = time.Now().Add(until)
	}
	return n, next, nil
}

// scheduledMayExist makes the next MoveDue look at the scheduled table
// again: the store has just created the schema, written a delayed event or
// made one due.
func (s *Store) scheduledMayExist() {
	s.schedAbsentUntil.Store(0)
	s.lookAt.Store(0)
}
