// Package pgsql holds the SQL that both of PostgreSQL's layouts share
// (package pgrows's rows table, package pglog's log tables): fragments
// of statements, not statements.
package pgsql

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
