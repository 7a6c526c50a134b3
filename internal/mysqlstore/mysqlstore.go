// Package mysqlstore keeps an outbox table in MySQL (8.0 and later) or
// MariaDB (10.6 and later): the backend of package outbox's Store on those
// databases (see package backend for the contract).
//
// The table has one row per message, updated as it is claimed, published,
// failed and parked, like PostgreSQL's rows layout; its rows are clustered
// by seq, the AUTO_INCREMENT order of their writes, and one secondary
// index, (published_at, parked_at, held, seq), serves the claims (its
// entries with published_at and parked_at NULL and held false, in the
// order of seq), the parked list, the published history by age (purges,
// the last hour's count) and the pending count.
//
// A claim is one short transaction at READ COMMITTED (claim.go): a locking
// read of the ready rows in the order of seq, FOR UPDATE SKIP LOCKED, so
// that concurrent claimers pass each other and no gap is locked
// (REPEATABLE READ's next-key locks would block the writers' inserts at
// the end of the index), then the UPDATE that writes the lease and the
// claim's token into the rows it locked; the rows are read after the
// commit. Marks are one UPDATE fenced by the token (the row count
// decides); a mark that matched fewer rows than it was given reads which
// ones it matched.
//
// An ordered table (ordered.go) has a trigger that gives each keyed row
// its place in its key's order (ord) while the writer holds the key's turn,
// a row of the keys table locked until the writer's transaction ends.
//
// Times are the database's, in UTC whatever the session's time zone
// (UTC_TIMESTAMP(6), DATETIME(6) columns), and are read as microseconds
// since the epoch, so that no DSN parameter (parseTime, loc) changes them.
package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/acemq/outbox/internal/backend"
)

// Store is the backend of one table.
type Store struct {
	quoted  string // `schema`.`name` or `name`
	keys    string // the keys table, quoted
	trigger string // the order trigger, quoted
	sched   string // the table of delayed messages, quoted (scheduled.go)
	schema  string // "" for the connection's database
	name    string

	q     queries
	sq    schedQueries   // scheduled.go
	ins   inspectQueries // inspect.go
	low   lowMark        // where claims read from (low.go)
	mu    sync.Mutex
	lists map[string]string // statement texts by kind and list length
}

var _ backend.Backend = (*Store)(nil)

// New returns the backend of the table name in schema ("" for the
// connection's database). Both are validated identifiers (package
// sqlident): lowercase letters, digits and underscores, at most 48 bytes,
// so that the names beside the table fit MySQL's 64.
func New(schema, name string) *Store {
	qualify := func(n string) string {
		if schema != "" {
			return "`" + schema + "`.`" + n + "`"
		}
		return "`" + n + "`"
	}
	s := &Store{quoted: qualify(name), keys: qualify(name + "_keys"), trigger: qualify(name + "_order"), sched: qualify(name + "_scheduled"),
		schema: schema, name: name, lists: map[string]string{}}
	s.q = newQueries(s.quoted)
	s.sq = newSchedQueries(s.sched)
	s.ins = newInspectQueries(s.quoted)
	return s
}

// now is the database's clock in UTC.
const now = `UTC_TIMESTAMP(6)`

// micros reads a DATETIME(6) column as microseconds since the epoch.
func micros(col string) string {
	return `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ` + col + `)`
}

// columns are a message's, read into a Row by scanRows.
var columns = `seq, id, event_type, event_key, exchange, routing_key, payload, content_type, headers,
	` + micros("created_at") + `, attempts, coalesce(last_error, ''), coalesce(claim_token, ''),
	coalesce(` + micros("claimed_until") + `, 0), coalesce(` + micros("parked_at") + `, 0), ord`

// A pending message is in exactly one of these: waiting (ready, in flight
// or retrying), held (behind a failed message of its key, on an ordered
// table) or parked.
const (
	waiting  = `published_at IS NULL AND parked_at IS NULL AND NOT held`
	held     = `published_at IS NULL AND parked_at IS NULL AND held`
	parked   = `published_at IS NULL AND parked_at IS NOT NULL`
	ready    = `available_at <= ` + now + ` AND (claimed_until IS NULL OR claimed_until <= ` + now + `)`
	inFlight = `claimed_until > ` + now
	retrying = `available_at > ` + now + ` AND (claimed_until IS NULL OR claimed_until <= ` + now + `)`
	// failing: a message that has failed and is not published yet; the
	// later messages of its key wait behind it until it is published,
	// re-armed or discarded.
	failing = `published_at IS NULL AND NOT held AND event_key <> '' AND (parked_at IS NOT NULL OR attempts > 0)`
)

type queries struct {
	candidates, orderedCandidates, fail, failed, holdOf   string
	pending, counts, countsLimited, parkedList, retryAll  string
	purge, purgeable, holdFind, unholdFind, unholdAllFind string
	look                                                  string
}

// replace fills in a statement's names and conditions.
func replace(table, q string) string {
	return strings.NewReplacer("{table}", table, "{columns}", columns, "{waiting}", waiting, "{held}", held, "{parked}", parked,
		"{ready}", ready, "{in_flight}", inFlight, "{retrying}", retrying, "{failing}", failing, "{now}", now).Replace(q)
}

func newQueries(table string) queries {
	r := func(q string) string { return replace(table, q) }
	return queries{
		// FORCE INDEX: the optimizer must walk the waiting rows in the
		// order of seq and stop at the LIMIT; a plan that sorted would
		// lock every row it read.
		// An unordered claim reads its rows whole, with the lease's end by
		// the database's clock (the UPDATE after it ends it no earlier).
		candidates: r(`SELECT {columns}, LENGTH(payload) + LENGTH(headers), ` + micros("{now} + INTERVAL ? MICROSECOND") + `
FROM {table} FORCE INDEX (state_idx)
WHERE {waiting} AND {ready} AND seq > ?
ORDER BY seq
LIMIT ?
FOR UPDATE SKIP LOCKED`),
		orderedCandidates: r(`SELECT seq, event_key, ord, LENGTH(payload) + LENGTH(headers) FROM {table} FORCE INDEX (state_idx)
WHERE {waiting} AND {ready} AND seq > ?
ORDER BY seq
LIMIT ?
FOR UPDATE SKIP LOCKED`),

		// MySQL assigns a single-table UPDATE's columns from left to
		// right, each seeing those before it: parked_at reads attempts
		// before it is counted.
		fail: r(`UPDATE {table} FORCE INDEX (PRIMARY)
SET parked_at = CASE WHEN attempts + 1 >= ? THEN {now} END,
    attempts = attempts + 1,
    last_error = ?,
    claimed_until = NULL,
    claim_token = NULL,
    available_at = {now} + INTERVAL ? MICROSECOND
WHERE seq = ? AND claim_token = ? AND published_at IS NULL`),
		failed: r(`SELECT attempts, parked_at IS NOT NULL, ord FROM {table} FORCE INDEX (PRIMARY) WHERE seq = ?`),
		// The waiting messages of the failed one's key after it.
		holdOf: r(`SELECT seq FROM {table} FORCE INDEX (key_idx)
WHERE event_key = ? AND published_at IS NULL AND parked_at IS NULL AND NOT held AND (ord > ? OR (ord = ? AND seq > ?))`),

		pending: r(`SELECT count(*) FROM {table} FORCE INDEX (state_idx) WHERE published_at IS NULL`),

		counts: r(`SELECT
	coalesce(sum(NOT held AND parked_at IS NULL AND {ready}), 0),
	coalesce(sum(NOT held AND parked_at IS NULL AND {in_flight}), 0),
	coalesce(sum(NOT held AND parked_at IS NULL AND {retrying}), 0),
	coalesce(sum(held AND parked_at IS NULL), 0),
	coalesce(sum(parked_at IS NOT NULL), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, min(created_at), {now}), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, min(CASE WHEN NOT held AND parked_at IS NULL AND {ready} THEN created_at END), {now}), 0),
	(SELECT count(*) FROM {table} FORCE INDEX (state_idx) WHERE published_at > {now} - INTERVAL 1 HOUR AND discarded_at IS NULL),
	(SELECT count(DISTINCT event_key) FROM {table} FORCE INDEX (state_idx) WHERE {parked} AND event_key <> '')
FROM {table} FORCE INDEX (state_idx) WHERE published_at IS NULL`),

		countsLimited: r(`SELECT
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {ready} LIMIT ?) AS r),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {in_flight} LIMIT ?) AS f),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {retrying} LIMIT ?) AS d),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {held} LIMIT ?) AS h),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {parked} LIMIT ?) AS k),
	coalesce(TIMESTAMPDIFF(MICROSECOND, least(
		coalesce((SELECT created_at FROM {table} FORCE INDEX (state_idx) WHERE {waiting} ORDER BY seq LIMIT 1), '9999-12-31'),
		coalesce((SELECT created_at FROM {table} FORCE INDEX (state_idx) WHERE {held} ORDER BY seq LIMIT 1), '9999-12-31'),
		coalesce((SELECT min(created_at) FROM {table} FORCE INDEX (state_idx) WHERE {parked}), '9999-12-31')), {now}), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, (SELECT created_at FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {ready} ORDER BY seq LIMIT 1), {now}), 0),
	(SELECT count(*) FROM (SELECT DISTINCT event_key FROM (SELECT event_key FROM {table} FORCE INDEX (state_idx) WHERE {parked} AND event_key <> '' LIMIT ?) AS e) AS b)`),

		parkedList: r(`SELECT {columns} FROM {table} FORCE INDEX (state_idx)
WHERE {parked}
  AND (? = '' OR event_type = ?) AND (? = '' OR event_key = ?)
  AND (? = '' OR LOCATE(?, coalesce(last_error, '')) > 0)
  AND (? = 0 OR (parked_at, seq) < (TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND, ?))
ORDER BY parked_at DESC, seq DESC
LIMIT ?`),

		retryAll: r(`UPDATE {table} SET parked_at = NULL, attempts = 0, available_at = {now} WHERE {parked}`),

		// Oldest first, by the index on published_at: each statement
		// deletes at most LIMIT rows.
		purge: r(`DELETE FROM {table}
WHERE published_at IS NOT NULL AND published_at < ?
ORDER BY published_at
LIMIT ?`),
		purgeable: r(`SELECT count(*) FROM {table} FORCE INDEX (state_idx)
WHERE published_at IS NOT NULL AND published_at < {now} - INTERVAL ? MICROSECOND`),

		// Reconcile (ordered.go) finds, without locking, the waiting rows
		// behind a failing message of their key, the held rows of keys
		// without one, and (unordered) every held row, in the order of seq.
		holdFind: r(`SELECT r.seq FROM {table} AS r
JOIN (SELECT DISTINCT event_key, ord, seq FROM {table} WHERE {failing}) AS f ON r.event_key = f.event_key
WHERE r.published_at IS NULL AND r.parked_at IS NULL AND NOT r.held AND (r.ord > f.ord OR (r.ord = f.ord AND r.seq > f.seq))
ORDER BY r.seq LIMIT ?`),
		unholdFind: r(`SELECT h.seq FROM {table} AS h
WHERE h.published_at IS NULL AND h.parked_at IS NULL AND h.held
  AND NOT EXISTS (SELECT 1 FROM {table} AS f WHERE f.event_key = h.event_key AND f.published_at IS NULL AND NOT f.held AND (f.parked_at IS NOT NULL OR f.attempts > 0))
ORDER BY h.seq LIMIT ?`),
		unholdAllFind: r(`SELECT seq FROM {table} FORCE INDEX (state_idx) WHERE {held} ORDER BY seq LIMIT ?`),
		// Maintain's look below the claims' low-water mark.
		look: r(`SELECT seq FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {ready} AND seq <= ? ORDER BY seq LIMIT 1`),
	}
}

// list returns the statement text for n values in its lists, built once
// per kind and length: "{in}" in text is replaced by n "?", "{rows}" by
// n "(?)".
func (s *Store) list(kind, text string, n int) string {
	key := kind + ":" + strconv.Itoa(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.lists[key]; ok {
		return q
	}
	q := strings.NewReplacer("{in}", strings.TrimSuffix(strings.Repeat("?,", n), ","),
		"{rows}", strings.TrimSuffix(strings.Repeat("(?),", n), ","),
		"{keys}", s.keys, "{scheduled}", s.sched).Replace(replace(s.quoted, text))
	s.lists[key] = q
	return q
}

// InsertSQL implements backend.Backend.
func (s *Store) InsertSQL(n int) string {
	return s.list("insert", `INSERT INTO {table} (id, event_type, event_key, exchange, routing_key, payload, content_type, headers) VALUES `+
		strings.TrimSuffix(strings.Repeat("(?,?,?,?,?,?,?,?),", n), ","), n)
}

// DuplicateID implements backend.Backend: error 1062, ER_DUP_ENTRY, on the
// id_idx key ("Duplicate entry '…' for key 'id_idx'", MySQL 8 names it
// "<table>.id_idx").
func (s *Store) DuplicateID(err error) (string, bool) {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1062 {
		return "", false
	}
	msg := me.Message
	if !strings.HasSuffix(msg, "id_idx'") {
		return "", false
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(msg, "Duplicate entry '"), "'")
	return id, true
}

// Exists implements backend.Backend.
func (s *Store) Exists(ctx context.Context, db *sql.DB) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
WHERE table_schema = coalesce(nullif(?, ''), DATABASE()) AND table_name = ?`, s.schema, s.name).Scan(&n)
	return n > 0, err
}

// SchemaVersion implements backend.Backend: 000001 makes the table,
// 000002 the table of delayed messages beside it.
func (s *Store) SchemaVersion(ctx context.Context, db *sql.DB) (version, latest int, err error) {
	var n int
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
WHERE table_schema = coalesce(nullif(?, ''), DATABASE()) AND table_name IN (?, ?)`, s.schema, s.name, s.name+"_scheduled").Scan(&n)
	return n, 2, err
}

// readCommitted runs fn in a transaction at READ COMMITTED, committed when
// fn returns nil and rolled back otherwise.
func readCommitted(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func scanRows(rows *sql.Rows, more ...func(*backend.Row) []any) ([]backend.Row, error) {
	defer rows.Close()
	var out []backend.Row
	for rows.Next() {
		var (
			r                         backend.Row
			created, claimed, parkedU int64
			token                     string // the claim's, set by Claim
		)
		dest := []any{&r.Seq, &r.ID, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &r.Headers,
			&created, &r.Attempts, &r.LastError, &token, &claimed, &parkedU, &r.Ord}
		for _, m := range more {
			dest = append(dest, m(&r)...)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		r.CreatedAt, r.ClaimedUntil, r.ParkedAt = fromMicros(created), fromMicros(claimed), fromMicros(parkedU)
		out = append(out, r)
	}
	return out, rows.Err()
}

func scanSeqs(rows *sql.Rows) ([]int64, error) {
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var q int64
		if err := rows.Scan(&q); err != nil {
			return nil, err
		}
		seqs = append(seqs, q)
	}
	return seqs, rows.Err()
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// args returns first followed by vals, as bind arguments.
func args[T any](vals []T, first ...any) []any {
	out := make([]any, 0, len(first)+len(vals))
	out = append(out, first...)
	for _, v := range vals {
		out = append(out, v)
	}
	return out
}
