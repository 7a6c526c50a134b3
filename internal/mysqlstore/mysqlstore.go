// Package mysqlstore keeps an outbox table in MySQL (8.0 and later) or
// MariaDB (10.6 and later): the backend of package outbox's Store on those
// databases (see package backend for the contract).
//
// The table has one row per message, updated as it is claimed, published,
// failed and parked, like PostgreSQL's rows layout; its rows are clustered
// by seq, the AUTO_INCREMENT order of their writes, and one secondary
// index, (published_at, parked_at, seq), serves the claims (its entries
// with both NULL, in the order of seq), the parked list, the published
// history by age (purges, the last hour's count) and the pending count.
//
// A claim is one short transaction at READ COMMITTED: a locking read of
// the ready rows in the order of seq, FOR UPDATE SKIP LOCKED, so that
// concurrent claimers pass each other and no gap is locked (REPEATABLE
// READ's next-key locks would block the writers' inserts at the end of
// the index), then the UPDATE that writes the lease and the claim's token
// into the rows it locked; the rows are read after the commit. Marks are
// one UPDATE fenced by the token (the row count decides); a mark that
// matched fewer rows than it was given reads which ones it matched.
//
// Times are the database's, in UTC whatever the session's time zone
// (UTC_TIMESTAMP(6), DATETIME(6) columns), and are read as microseconds
// since the epoch, so that no DSN parameter (parseTime, loc) changes them.
package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
)

// Store is the backend of one table.
type Store struct {
	quoted string // `schema`.`name` or `name`
	schema string // "" for the connection's database
	name   string

	q       queries
	mu      sync.Mutex
	inserts map[int]string
	lists   map[string]string // statement texts by kind and IN-list length
}

var _ backend.Backend = (*Store)(nil)

// New returns the backend of the table name in schema ("" for the
// connection's database). Both are validated identifiers (package
// sqlident): lowercase letters, digits and underscores.
func New(schema, name string) *Store {
	quoted := "`" + name + "`"
	if schema != "" {
		quoted = "`" + schema + "`." + quoted
	}
	s := &Store{quoted: quoted, schema: schema, name: name, inserts: map[int]string{}, lists: map[string]string{}}
	s.q = newQueries(quoted)
	return s
}

// now is the database's clock in UTC.
const now = `UTC_TIMESTAMP(6)`

// micros reads a DATETIME(6) column as microseconds since the epoch.
func micros(col string) string {
	return `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ` + col + `)`
}

// columns are a message's, read into a Row by scanRow.
var columns = `seq, id, event_type, event_key, exchange, routing_key, payload, content_type, headers,
	` + micros("created_at") + `, attempts, coalesce(last_error, ''), coalesce(claim_token, ''),
	coalesce(` + micros("claimed_until") + `, 0), coalesce(` + micros("parked_at") + `, 0)`

// A pending message is in exactly one of these: waiting (ready, in flight
// or retrying) or parked. Held is ordered mode's, which this backend does
// not have yet: no row is ever held.
const (
	waiting  = `published_at IS NULL AND parked_at IS NULL`
	parked   = `published_at IS NULL AND parked_at IS NOT NULL`
	ready    = `available_at <= ` + now + ` AND (claimed_until IS NULL OR claimed_until <= ` + now + `)`
	inFlight = `claimed_until > ` + now
	retrying = `available_at > ` + now + ` AND (claimed_until IS NULL OR claimed_until <= ` + now + `)`
)

type queries struct {
	candidates, fail, failed, pending, counts, countsLimited string
	parkedList, retryAll, purge, purgeable                   string
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{table}", table, "{columns}", columns, "{waiting}", waiting, "{parked}", parked,
		"{ready}", ready, "{in_flight}", inFlight, "{retrying}", retrying, "{now}", now)
	return queries{
		// FORCE INDEX: the optimizer must walk the waiting rows in the
		// order of seq and stop at the LIMIT; a plan that sorted would
		// lock every row it read.
		candidates: r.Replace(`SELECT seq, LENGTH(payload) + LENGTH(headers) FROM {table} FORCE INDEX (state_idx)
WHERE {waiting} AND {ready}
ORDER BY published_at, parked_at, seq
LIMIT ?
FOR UPDATE SKIP LOCKED`),

		// MySQL assigns a single-table UPDATE's columns from left to
		// right, each seeing those before it: parked_at reads attempts
		// before it is counted.
		fail: r.Replace(`UPDATE {table}
SET parked_at = CASE WHEN attempts + 1 >= ? THEN {now} END,
    attempts = attempts + 1,
    last_error = ?,
    claimed_until = NULL,
    claim_token = NULL,
    available_at = {now} + INTERVAL ? MICROSECOND
WHERE seq = ? AND claim_token = ? AND published_at IS NULL`),
		failed: r.Replace(`SELECT attempts, parked_at IS NOT NULL FROM {table} WHERE seq = ?`),

		pending: r.Replace(`SELECT count(*) FROM {table} FORCE INDEX (state_idx) WHERE published_at IS NULL`),

		counts: r.Replace(`SELECT
	coalesce(sum({waiting} AND {ready}), 0),
	coalesce(sum({waiting} AND {in_flight}), 0),
	coalesce(sum({waiting} AND {retrying}), 0),
	coalesce(sum(parked_at IS NOT NULL), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, min(created_at), {now}), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, min(CASE WHEN {waiting} AND {ready} THEN created_at END), {now}), 0),
	(SELECT count(*) FROM {table} FORCE INDEX (state_idx) WHERE published_at > {now} - INTERVAL 1 HOUR AND discarded_at IS NULL),
	(SELECT count(DISTINCT event_key) FROM {table} FORCE INDEX (state_idx) WHERE {parked} AND event_key <> '')
FROM {table} FORCE INDEX (state_idx) WHERE published_at IS NULL`),

		countsLimited: r.Replace(`SELECT
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {ready} LIMIT ?) AS r),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {in_flight} LIMIT ?) AS f),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {retrying} LIMIT ?) AS d),
	(SELECT count(*) FROM (SELECT 1 FROM {table} FORCE INDEX (state_idx) WHERE {parked} LIMIT ?) AS k),
	coalesce(TIMESTAMPDIFF(MICROSECOND, least(
		coalesce((SELECT created_at FROM {table} FORCE INDEX (state_idx) WHERE {waiting} ORDER BY published_at, parked_at, seq LIMIT 1), '9999-12-31'),
		coalesce((SELECT min(created_at) FROM {table} FORCE INDEX (state_idx) WHERE {parked}), '9999-12-31')), {now}), 0),
	coalesce(TIMESTAMPDIFF(MICROSECOND, (SELECT created_at FROM {table} FORCE INDEX (state_idx) WHERE {waiting} AND {ready} ORDER BY published_at, parked_at, seq LIMIT 1), {now}), 0),
	(SELECT count(*) FROM (SELECT DISTINCT event_key FROM (SELECT event_key FROM {table} FORCE INDEX (state_idx) WHERE {parked} AND event_key <> '' LIMIT ?) AS e) AS b)`),

		parkedList: r.Replace(`SELECT {columns} FROM {table} FORCE INDEX (state_idx)
WHERE {parked}
ORDER BY parked_at DESC, seq
LIMIT ?`),

		retryAll: r.Replace(`UPDATE {table} SET parked_at = NULL, attempts = 0, available_at = {now} WHERE {parked}`),

		// Oldest first, by the index on published_at: each statement
		// deletes at most LIMIT rows.
		purge: r.Replace(`DELETE FROM {table}
WHERE published_at IS NOT NULL AND published_at < ?
ORDER BY published_at
LIMIT ?`),
		purgeable: r.Replace(`SELECT count(*) FROM {table} FORCE INDEX (state_idx)
WHERE published_at IS NOT NULL AND published_at < {now} - INTERVAL ? MICROSECOND`),
	}
}

// list returns the statement of kind for n values in its IN list, built
// once per kind and length ("{in}" in the text is replaced by n "?").
func (s *Store) list(kind, text string, n int) string {
	key := kind + ":" + strconv.Itoa(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.lists[key]; ok {
		return q
	}
	marks := strings.TrimSuffix(strings.Repeat("?,", n), ",")
	q := strings.NewReplacer("{table}", s.quoted, "{in}", marks, "{now}", now, "{parked}", parked, "{columns}", columns).Replace(text)
	s.lists[key] = q
	return q
}

// InsertSQL implements backend.Backend.
func (s *Store) InsertSQL(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.inserts[n]; ok {
		return q
	}
	row := "(?,?,?,?,?,?,?,?)"
	q := "INSERT INTO " + s.quoted + " (id, event_type, event_key, exchange, routing_key, payload, content_type, headers) VALUES " +
		strings.TrimSuffix(strings.Repeat(row+",", n), ",")
	s.inserts[n] = q
	return q
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

// Claim implements backend.Backend.
func (s *Store) Claim(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64) ([]backend.Row, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("generating claim token: %w", err)
	}
	seqs, err := s.lock(ctx, db, n, lease, maxBytes, token.String())
	if err != nil || len(seqs) == 0 {
		return nil, err
	}
	args := make([]any, 0, len(seqs)+1)
	args = append(args, token.String())
	for _, q := range seqs {
		args = append(args, q)
	}
	rows, err := db.QueryContext(ctx, s.list("claimed", `SELECT {columns} FROM {table} WHERE claim_token = ? AND seq IN ({in}) ORDER BY seq`, len(seqs)), args...)
	if err != nil {
		return nil, fmt.Errorf("reading the claimed messages: %w", err)
	}
	return scanRows(rows)
}

// lock is the claim's transaction: the candidates locked, the lease
// written into those within the byte window.
func (s *Store) lock(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, token string) (seqs []int64, err error) {
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		seqs, err = s.lockIn(ctx, tx, n, lease, maxBytes, token)
		return err
	})
	return seqs, err
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

func (s *Store) lockIn(ctx context.Context, tx *sql.Tx, n int, lease time.Duration, maxBytes int64, token string) (seqs []int64, err error) {
	rows, err := tx.QueryContext(ctx, s.q.candidates, n)
	if err != nil {
		return nil, err
	}
	var before int64
	for rows.Next() {
		var seq, size int64
		if err := rows.Scan(&seq, &size); err != nil {
			rows.Close()
			return nil, err
		}
		if len(seqs) > 0 && before >= maxBytes {
			continue // read on: the rows must be closed, and are few
		}
		seqs = append(seqs, seq)
		before += size
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(seqs) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(seqs)+2)
	args = append(args, lease.Microseconds(), token)
	for _, q := range seqs {
		args = append(args, q)
	}
	_, err = tx.ExecContext(ctx, s.list("lease", `UPDATE {table} SET claimed_until = {now} + INTERVAL ? MICROSECOND, claim_token = ? WHERE seq IN ({in})`, len(seqs)), args...)
	return seqs, err
}

// Settle implements backend.Backend. A message published keeps the token
// of the claim that published it, so that a mark repeated after a reply
// that was lost (the first one committed) finds it its own.
func (s *Store) Settle(ctx context.Context, db *sql.DB, published bool, claim string, seqs []int64) ([]int64, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(seqs)+1)
	args = append(args, claim)
	for _, q := range seqs {
		args = append(args, q)
	}
	if !published {
		return s.release(ctx, db, args, len(seqs))
	}
	res, err := db.ExecContext(ctx, s.list("publish", `UPDATE {table} SET published_at = {now}, claimed_until = NULL
WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NULL`, len(seqs)), args...)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err == nil && n == int64(len(seqs)) {
		return seqs, nil
	}
	// Fewer than given: those still carrying the token are the claim's.
	return s.seqsOf(ctx, db, s.list("published", `SELECT seq FROM {table} WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NOT NULL`, len(seqs)), args)
}

// release gives back the rows of seqs the claim holds: the token is
// cleared, so the rows are read, locked, first.
func (s *Store) release(ctx context.Context, db *sql.DB, args []any, n int) (done []int64, err error) {
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.list("held", `SELECT seq FROM {table} WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NULL FOR UPDATE`, n), args...)
		if err != nil {
			return err
		}
		if done, err = scanSeqs(rows); err != nil || len(done) == 0 {
			return err
		}
		args = args[:1]
		for _, q := range done {
			args = append(args, q)
		}
		_, err = tx.ExecContext(ctx, s.list("release", `UPDATE {table} SET claimed_until = NULL, claim_token = NULL WHERE claim_token = ? AND seq IN ({in})`, len(done)), args...)
		return err
	})
	return done, err
}

func (s *Store) seqsOf(ctx context.Context, db *sql.DB, query string, args []any) ([]int64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanSeqs(rows)
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

// Fail implements backend.Backend.
func (s *Store) Fail(ctx context.Context, db *sql.DB, seq int64, claim, reason string, delay time.Duration, maxAttempts int) (backend.Failure, bool, error) {
	res, err := db.ExecContext(ctx, s.q.fail, maxAttempts, reason, delay.Microseconds(), seq, claim)
	if err != nil {
		return backend.Failure{}, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return backend.Failure{}, false, err
	}
	var f backend.Failure
	err = db.QueryRowContext(ctx, s.q.failed, seq).Scan(&f.Attempts, &f.Parked)
	return f, true, err
}

// Pending implements backend.Backend.
func (s *Store) Pending(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, s.q.pending).Scan(&n)
	return n, err
}

// Counts implements backend.Backend.
func (s *Store) Counts(ctx context.Context, db *sql.DB, limit int64) (backend.Counts, error) {
	var (
		c              backend.Counts
		oldest, oldRdy int64
		err            error
	)
	if limit <= 0 {
		err = db.QueryRowContext(ctx, s.q.counts).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Parked,
			&oldest, &oldRdy, &c.PublishedLastHour, &c.BlockedKeys)
	} else {
		err = db.QueryRowContext(ctx, s.q.countsLimited, limit, limit, limit, limit, limit).Scan(&c.Ready, &c.InFlight, &c.Retrying, &c.Parked,
			&oldest, &oldRdy, &c.BlockedKeys)
	}
	c.OldestPending, c.OldestReady = time.Duration(max(oldest, 0))*time.Microsecond, time.Duration(max(oldRdy, 0))*time.Microsecond
	return c, err
}

// Parked implements backend.Backend.
func (s *Store) Parked(ctx context.Context, db *sql.DB, limit int) ([]backend.Row, error) {
	rows, err := db.QueryContext(ctx, s.q.parkedList, limit)
	if err != nil {
		return nil, err
	}
	return scanRows(rows)
}

// idsChunk bounds the ids of one statement of ChangeParked.
const idsChunk = 500

// ChangeParked implements backend.Backend.
func (s *Store) ChangeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	if ids == nil {
		res, err := db.ExecContext(ctx, s.q.retryAll)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	kind, text := "retry", `UPDATE {table} SET parked_at = NULL, attempts = 0, available_at = {now} WHERE id IN ({in}) AND {parked}`
	if discard {
		kind, text = "discard", `UPDATE {table} SET published_at = {now}, discarded_at = {now} WHERE id IN ({in}) AND {parked}`
	}
	var total int64
	for start := 0; start < len(ids); start += idsChunk {
		chunk := ids[start:min(start+idsChunk, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		res, err := db.ExecContext(ctx, s.list(kind, text, len(chunk)), args...)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Purge implements backend.Backend. The cutoff is read once, so that the
// purge ends; each statement runs at READ COMMITTED, locking the rows it
// deletes and no gap (a next-key lock at the end of the range could hold
// up the marks that add published rows there).
func (s *Store) Purge(ctx context.Context, db *sql.DB, olderThan time.Duration, batch int, progress func(int64)) (int64, error) {
	var cutoff string
	if err := db.QueryRowContext(ctx, `SELECT CAST(`+now+` - INTERVAL ? MICROSECOND AS CHAR)`, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, err
	}
	var total int64
	for {
		n, err := s.purgeOnce(ctx, db, cutoff, batch)
		total += n
		if err != nil {
			return total, err
		}
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

func (s *Store) purgeOnce(ctx context.Context, db *sql.DB, cutoff string, batch int) (n int64, err error) {
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q.purge, cutoff, batch)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	return n, err
}

// Purgeable implements backend.Backend.
func (s *Store) Purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, s.q.purgeable, olderThan.Microseconds()).Scan(&n)
	return n, err
}

func scanRows(rows *sql.Rows) ([]backend.Row, error) {
	defer rows.Close()
	var out []backend.Row
	for rows.Next() {
		var (
			r                         backend.Row
			created, claimed, parkedU int64
		)
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &r.Headers,
			&created, &r.Attempts, &r.LastError, &r.Claim, &claimed, &parkedU); err != nil {
			return nil, err
		}
		r.CreatedAt, r.ClaimedUntil, r.ParkedAt = fromMicros(created), fromMicros(claimed), fromMicros(parkedU)
		out = append(out, r)
	}
	return out, rows.Err()
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}
