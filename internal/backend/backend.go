// Package backend is the seam between package outbox's Store and the SQL
// of one database: what a Store asks of the storage that keeps its table,
// in types that belong to neither side. Store validates what it is given,
// holds the neutral logic (events checked and encoded, headers decoded,
// unfit rows parked, lost leases reported, backoff chosen) and dispatches
// to the Backend chosen when the Store is made, by the database its pool
// or its configuration names.
//
// A Backend's methods are the store's contract (../shared/seed): claims by
// lease decided by the database (a message is in at most one live claim),
// marks fenced by the claim that took the message, a failed attempt that
// parks the message at the last one, bounded purges. A Backend never
// retries on its own: its errors go back to the relay, which classifies
// them (package dberr) and backs off.
package backend

import (
	"context"
	"database/sql"
	"math"
	"time"
)

// Row is one message as a backend reads it.
type Row struct {
	ID                                   string
	Seq                                  int64
	EventType, Key, Exchange, RoutingKey string
	Payload                              []byte
	ContentType                          string
	Headers                              []byte // a JSON object, as stored
	CreatedAt, ClaimedUntil, ParkedAt    time.Time
	Attempts                             int
	LastError                            string
	Claim                                Claim     // the claim that returned it; nil when not claimed
	Unfit                                string    // why the row cannot be relayed as written (a column that does not scan); "" when it can
	Ord                                  int64     // its place in its key's order on an ordered table (0: none)
	Due                                  time.Time // when a delayed message is due (ListScheduled)
	State                                string    // KeyQueue: StateReady, StateInFlight, …
	// Parked says that the claim that read the row parked it itself, as
	// unfit (Unfit says why, LastError is what it recorded): the store
	// reports it and does not relay it.
	Parked bool
}

// Ref names a claimed message to a settle: its id, its seq and its key.
type Ref struct {
	ID  string
	Seq int64
	Key string
}

// Claim is what a backend's claim wrote in the rows it took, of a type of
// that backend's own: a settle given a claim of another type (a message
// claimed from a table of another kind) finds its lease lost. Claims are
// comparable: the messages of one claim are settled together.
type Claim interface {
	// Backend names the backend that made the claim.
	Backend() string
}

// An OrderFinder is a claim that can say it found its table ordered while
// the store claimed it unordered (the table was made ordered meanwhile):
// the store then relays in ordered mode from that claim on.
type OrderFinder interface {
	FoundOrdered() bool
}

// UnfitReason is the last error of a message parked because its row
// cannot be relayed as written (unfit says why).
func UnfitReason(unfit string) string {
	return "outbox: parked when claimed: the row cannot be relayed as written (" + unfit +
		"): correct it by SQL and retry it, or discard it"
}

// BadRowError is the failure to read a claimed row whose id cannot be
// read either: nothing can be said of the row but the claim that took it.
type BadRowError struct{ Err error }

func (e BadRowError) Error() string { return e.Err.Error() }
func (e BadRowError) Unwrap() error { return e.Err }

// Counts are a table's messages by state, as Store.Stats and Store.Gauges
// report them (see outbox.Stats): Ready + InFlight + Retrying + Held +
// Parked is what is pending.
type Counts struct {
	Ready, InFlight, Retrying, Held, Parked int64
	PublishedLastHour, BlockedKeys          int64
	OldestPending, OldestReady              time.Duration
}

// Failure is what a failed attempt left: the attempts counted so far, and
// whether that one parked the message.
type Failure struct {
	Attempts int
	Parked   bool
}

// Backend keeps an outbox table in one database: its queue (the store's
// contract), and the writes, schema, order and delayed messages of its
// table.
type Backend interface {
	Queue

	// InsertSQL is the statement that writes n rows of the eight columns
	// id, event_type, event_key, exchange, routing_key, payload,
	// content_type, headers (a JSON object as text), bound in that order;
	// built once per n.
	InsertSQL(n int) string
	// DuplicateID says whether err is a unique violation of the table's
	// message ids, and the id when the server names it.
	DuplicateID(err error) (id string, ok bool)

	// SchemaStatements are the DDL that creates the table (unordered),
	// each statement idempotent; DropStatements drop it.
	SchemaStatements() []string
	DropStatements() []string
	// Exists says whether the table is there.
	Exists(ctx context.Context, db *sql.DB) (bool, error)
	// SchemaVersion says which of the backend's migrations the table has
	// (the number of the newest applied, as the migration files number
	// them) and the latest.
	SchemaVersion(ctx context.Context, db *sql.DB) (version, latest int, err error)

	// OrderStatements make the table ordered, UnorderStatements
	// unordered.
	OrderStatements() []string
	UnorderStatements() []string
	// Ordered says whether the table is ordered (keeps each key's order,
	// whatever writes to it); SetOrdered makes it so, or not.
	Ordered(ctx context.Context, db *sql.DB) (bool, error)
	SetOrdered(ctx context.Context, db *sql.DB, ordered bool) error
	// KeyTurnSQL is the statement with which a writer takes the turns of
	// n distinct keys, bound in the order to take them (sorted), before
	// it writes their messages into an ordered table.
	KeyTurnSQL(n int) string

	// ScheduleStatements create the table of delayed messages beside the
	// table (idempotent); the down migration drops it apart.
	ScheduleStatements() []string
	// ScheduleSQL is the statement that writes n delayed messages: the
	// eight columns of InsertSQL, then the delay in microseconds from the
	// database's now.
	ScheduleSQL(n int) string
	// Promote moves up to n delayed messages that are due into the table,
	// as a writer would write them then: each key's in the order they fell
	// due, the keys in sorted order. A due message whose ID is in the
	// table already stays, with reason as its last error. It returns how
	// many it moved, how many it left so, and how far from now the next
	// of the others is due: NoneDue when there is none, 0 when one may be
	// due already or it cannot say without another statement.
	Promote(ctx context.Context, db *sql.DB, n int, reason string) (moved, refused int64, next time.Duration, err error)
	// Scheduled counts the delayed messages (up to limit), those it could
	// not move too, and how far from now the next of the others is due
	// (ok false: none).
	Scheduled(ctx context.Context, db *sql.DB, limit int64) (n int64, next time.Duration, ok bool, err error)
	// ListScheduled lists up to q.Limit delayed messages that match q, the
	// soonest due first (by due, then id), with their due time and, for
	// one not moved, its last error.
	ListScheduled(ctx context.Context, db *sql.DB, q ScheduledQuery) ([]Row, error)
	// ChangeScheduled makes the delayed messages among ids due now (and
	// one not moved is tried again), or with discard deletes them, and
	// returns how many it changed.
	ChangeScheduled(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error)
}

// Queue is the store's contract over one table (../shared/seed): claims
// by lease, fenced settles and failures, upkeep, counts, the parked
// messages and purges. Every backend implements it, each in a package of
// its own: PostgreSQL's rows layout (pgrows), its log layout (pglog) and
// MySQL's table (mysqlstore).
type Queue interface {
	// Claim takes up to n ready messages, in the order they were written,
	// for lease, and no more of them than keep the bytes of the payloads
	// and headers before the last one under maxBytes (one, however
	// large). Each message is in at most one live claim. When ordered, a
	// message of a key is claimed only with every unpublished message of
	// its key before it, and the claim returns a key's messages in their
	// order.
	//
	// It returns the claim it made with the rows it took (each row
	// carries its own: a backend may take rows under several claims in
	// one call), and with an error when it had made one (see GiveBacker).
	// A row that cannot be read as written is returned with Unfit set,
	// for the store to park (Fail), or, parked by the claim itself, with
	// Parked set too; one whose id cannot be read either fails the claim
	// with a BadRowError.
	Claim(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, ordered bool) ([]Row, Claim, error)
	// Settle marks published (or releases) the messages of refs that
	// claim still holds, and returns the indexes in refs of those it
	// marked: the others' leases were lost. When ordered, a message
	// published brings back the messages held behind it.
	Settle(ctx context.Context, db *sql.DB, published bool, claim Claim, refs []Ref, ordered bool) (done []int, err error)
	// Fail counts a failed attempt at the message ref that claim still
	// holds: it waits delay, or is parked when the attempts reach
	// maxAttempts; when ordered, the later messages of its key are held
	// behind it. ok is false when the claim was lost.
	Fail(ctx context.Context, db *sql.DB, ref Ref, claim Claim, reason string, delay time.Duration, maxAttempts int, ordered bool) (f Failure, ok bool, err error)
	// Maintain does the upkeep beside the claims, so that no claim waits
	// for it; a relay calls it every 100ms.
	Maintain(ctx context.Context, db *sql.DB) error
	// Reconcile holds the waiting messages of keys whose first message
	// has failed (ordered) and brings back the held messages of the
	// others (all of them, unordered).
	Reconcile(ctx context.Context, db *sql.DB, ordered bool) (held, unheld int64, err error)

	// Pending counts the messages not published yet, all of them.
	Pending(ctx context.Context, db *sql.DB) (int64, error)
	// Counts reads the table's messages by state, each count stopping at
	// limit (0: no limit, and PublishedLastHour is read too).
	Counts(ctx context.Context, db *sql.DB, limit int64) (Counts, error)
	// Parked lists up to q.Limit parked messages that match q, the
	// latest parked first (by parked_at, then seq, both descending).
	Parked(ctx context.Context, db *sql.DB, q ParkedQuery) ([]Row, error)
	// ChangeParked retries (or discards) the parked messages among ids,
	// every parked message when ids is nil (retry only), and returns how
	// many it changed; the messages held behind them come back.
	ChangeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error)
	// Purge deletes published messages older than olderThan, by the
	// database's clock, in statements of at most batch rows, calling
	// progress after each.
	Purge(ctx context.Context, db *sql.DB, olderThan time.Duration, batch int, progress func(int64)) (int64, error)
	// Purgeable counts what Purge would delete.
	Purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error)

	Inspector
}

// A GiveBacker gives back at once what a claim that failed may have taken
// all the same (its context ended, or its connection was lost, while or
// after the server committed it), instead of leaving it to its lease. It
// returns how many messages it gave back. Giving back a claim that did
// not commit changes nothing.
type GiveBacker interface {
	GiveBack(ctx context.Context, db *sql.DB, claim Claim) (int64, error)
}

// NoneDue is what Promote returns as the next due time when no delayed
// message waits.
const NoneDue = time.Duration(math.MaxInt64)

// ScheduledQuery selects delayed messages: at most Limit, those whose type
// and key are EventType and Key (each "" for any), due after the message
// at (AfterDue, AfterID) in the list's order (AfterDue zero: from the
// first). AfterDue is in microseconds since the epoch.
type ScheduledQuery struct {
	Limit          int
	EventType, Key string
	AfterDue       int64
	AfterID        string
}

// ParkedQuery selects parked messages: at most Limit, those whose type
// and key are EventType and Key and whose last error contains ErrorText
// (each "" for any), parked before the message at (AfterParkedAt,
// AfterSeq) in the list's order (AfterParkedAt zero: from the first).
// AfterParkedAt is in microseconds since the epoch, exact on every
// database this module supports.
type ParkedQuery struct {
	Limit                     int
	EventType, Key, ErrorText string
	AfterParkedAt, AfterSeq   int64
}

// Args are q's values in the order of ParkedConditions' placeholders,
// from the second on (the first is the limit).
func (q ParkedQuery) Args() []any {
	return []any{q.Limit, q.EventType, q.Key, q.ErrorText, q.AfterParkedAt, q.AfterSeq}
}
