// Package pgsql holds the SQL that both of PostgreSQL's layouts share
// (package pgrows's rows table, package pglog's log tables): fragments
// of statements, not statements.
package pgsql

import (
	"database/sql"

	"github.com/acemq/outbox/internal/backend"
)

// AsyncCommit makes the transaction it runs in commit asynchronously:
// the claims, batches, marks and releases of a relay commit so. They are
// the relay's bookkeeping, two commits per batch or more, and each would
// otherwise wait for a flush of the WAL. What a crash of the database can
// lose of them is the last few hundred milliseconds (at most three times
// wal_writer_delay), and losing them only makes the relay publish those
// messages again: a lost batch row makes the next claim take its window
// again, a lost settle leaves its messages to be taken over (on a rows
// table: a lost claim leaves the messages to the next claim, a lost mark
// or release leaves them to be claimed again after the lease). It never
// loses a message: the WAL is written in order, so a record that did
// reach the disk (a later batch, a purge that relied on the settles)
// brings every earlier commit with it.
const AsyncCommit = `set_config('synchronous_commit', 'off', true)`

// AsyncCondition is AsyncCommit as a condition of a statement's WHERE:
// an uncorrelated subquery, which PostgreSQL evaluates once, as a
// one-time filter, before the statement writes a row.
const AsyncCondition = `(SELECT ` + AsyncCommit + `) IS NOT NULL`

// ParkedFilter is the condition of a parked list over the rows named o,
// its placeholders those of backend.ParkedQuery.Args.
const ParkedFilter = `
  AND ($2::text = '' OR o.event_type = $2::text) AND ($3::text = '' OR o.event_key = $3::text)
  AND ($4::text = '' OR strpos(coalesce(o.last_error, ''), $4::text) > 0)
  AND ($5::bigint = 0 OR (o.parked_at, coalesce(o.seq, 0)) < ('epoch'::timestamptz + $5::bigint * interval '1 microsecond', $6::bigint))`

// ScanRows reads rows of the message columns both layouts return (id,
// seq, event_type, event_key, exchange, routing_key, payload,
// content_type, headers, created_at, attempts, last_error,
// claimed_until, parked_at), each with claim, and the columns after them
// into what more returns of each row. A row that cannot be read as
// written (a column that does not scan) is returned with Unfit set; one
// whose id cannot be read either is a backend.BadRowError.
func ScanRows(rows *sql.Rows, claim backend.Claim, more ...func(*backend.Row) []any) ([]backend.Row, error) {
	defer rows.Close()
	var out []backend.Row
	for rows.Next() {
		var (
			r                 backend.Row
			claimed, parkedAt sql.NullTime
		)
		dest := []any{&r.ID, &r.Seq, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload,
			&r.ContentType, &r.Headers, &r.CreatedAt, &r.Attempts, &r.LastError, &claimed, &parkedAt}
		for _, m := range more {
			dest = append(dest, m(&r)...)
		}
		if err := rows.Scan(dest...); err != nil {
			if r.ID == "" {
				return nil, backend.BadRowError{Err: err}
			}
			r.Unfit, r.Headers = err.Error(), nil
		}
		r.ClaimedUntil, r.ParkedAt, r.Claim = claimed.Time, parkedAt.Time, claim
		out = append(out, r)
	}
	return out, rows.Err()
}

// ScanDone reads the ids a settle returned (RETURNING id) and returns
// the indexes in refs of those messages: the others' leases were lost.
func ScanDone(rows *sql.Rows, refs []backend.Ref) ([]int, error) {
	defer rows.Close()
	at := make(map[string]int, len(refs))
	for i, r := range refs {
		at[r.ID] = i
	}
	done := make([]int, 0, len(refs))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if i, ok := at[id]; ok {
			done = append(done, i)
		}
	}
	return done, rows.Err()
}

// IDs are the ids of refs, bound as a uuid[].
func IDs(refs []backend.Ref) []string {
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.ID
	}
	return ids
}
