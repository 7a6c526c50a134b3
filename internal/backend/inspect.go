package backend

import (
	"context"
	"database/sql"
	"time"
)

// Lease is one live claim on a table: what a relay holds now.
type Lease struct {
	// Claim names the claim in the backend's terms (its token, or a log
	// table's batch and generation).
	Claim string
	// Messages counts the claim's messages not yet published, released
	// or failed.
	Messages int64
	// Until is when the lease ends, by the database's clock.
	Until time.Time
}

// BlockedKey is a key that has parked messages: on an ordered table its
// later messages wait (Held) until an operator retries or discards them.
type BlockedKey struct {
	Key    string
	Parked int64     // its parked messages
	Held   int64     // its messages set aside behind them (ordered tables)
	Since  time.Time // when the first of its parked messages was parked
}

// HeldQuery selects held messages: at most Limit, those whose type and key
// are EventType and Key (each "" for any), written no later than
// CreatedBefore (microseconds since the epoch; 0 for any), after seq
// AfterSeq.
type HeldQuery struct {
	Limit          int
	EventType, Key string
	CreatedBefore  int64
	AfterSeq       int64
}

// The states of a pending message, as KeyQueue reads them (Row.State).
const (
	StateReady    = "ready"
	StateInFlight = "in flight"
	StateRetrying = "retrying"
	StateHeld     = "held"
	StateParked   = "parked"
)

// Inspector reads what an operator looks at beside the counts: the live
// claims, the blocked keys, a key's queue and the published history by
// minute. Every method reads; none takes a lock a claim or a writer waits
// for.
type Inspector interface {
	// Leases lists up to limit live claims (their leases not expired and
	// something in them unsettled), the first to end first.
	Leases(ctx context.Context, db *sql.DB, limit int) ([]Lease, error)
	// BlockedKeys lists up to limit keys that have a parked message, the
	// longest parked first.
	BlockedKeys(ctx context.Context, db *sql.DB, limit int) ([]BlockedKey, error)
	// KeyQueue lists up to limit unpublished messages of key in the order
	// they are published in, each with its State. Messages not yet taken
	// by a claim are listed on every backend but PostgreSQL's log layout,
	// whose events table has no index by key: there it lists those that
	// failed or wait behind one that did.
	KeyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]Row, error)
	// Held lists up to q.Limit held messages that match q (set aside
	// behind a failed message of their key, on an ordered table), in the
	// order of seq.
	Held(ctx context.Context, db *sql.DB, q HeldQuery) ([]Row, error)
	// PublishedByMinute counts the messages published in each of the
	// last minutes minutes, by the database's clock: [0] is the current
	// minute (the last 60 seconds), [1] the one before.
	PublishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error)
}

// ScanMinutes reads rows of (minutes ago, count) into counts by minute,
// [0] the current one, of n minutes; a row outside them is left out.
func ScanMinutes(rows *sql.Rows, n int) ([]int64, error) {
	defer rows.Close()
	out := make([]int64, n)
	for rows.Next() {
		var (
			ago int
			c   int64
		)
		if err := rows.Scan(&ago, &c); err != nil {
			return nil, err
		}
		if ago >= 0 && ago < n {
			out[ago] += c
		}
	}
	return out, rows.Err()
}

// ScanLeases reads rows of (claim, messages, until) into Leases, on a
// driver that scans a timestamp into a time.Time.
func ScanLeases(rows *sql.Rows) ([]Lease, error) {
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		var l Lease
		if err := rows.Scan(&l.Claim, &l.Messages, &l.Until); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// ScanBlockedKeys reads rows of (key, parked, since, held) into
// BlockedKeys, on a driver that scans a timestamp into a time.Time.
func ScanBlockedKeys(rows *sql.Rows) ([]BlockedKey, error) {
	defer rows.Close()
	var out []BlockedKey
	for rows.Next() {
		var k BlockedKey
		if err := rows.Scan(&k.Key, &k.Parked, &k.Since, &k.Held); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
