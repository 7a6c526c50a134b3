package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/acemq/outbox/internal/backend"
)

// What an operator looks at beside the counts (Stats): the live claims, the
// blocked keys, a key's queue and the published history by minute. These
// are what package console shows; each reads, and none takes a lock a
// claim or a writer waits for.

// InspectMax is the most items Leases, BlockedKeys and KeyQueue return.
const InspectMax = 1000

// Lease is one live claim on the table: messages a relay has claimed and
// not yet published, released or failed, under a lease that has not
// expired.
type Lease struct {
	// Claim names the claim: its token on the rows layout and on MySQL;
	// on the log layout, the batch and its generation (a take-over claims
	// a batch again under the next), or the token of a claim of failed
	// messages.
	Claim string
	// Messages counts the claim's messages still unsettled.
	Messages int64
	// Until is when the lease ends, by the database's clock; another
	// relay may claim them after it.
	Until time.Time
}

// Leases lists up to limit live claims (at most InspectMax), the first to
// end first: what the relays are working on.
func (s *Store) Leases(ctx context.Context, limit int) ([]Lease, error) {
	db, ops, err := s.inspect(ctx, "Leases", limit)
	if err != nil {
		return nil, err
	}
	ls, err := ops.leases(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing the live claims of %s: %w", s.t.full, err)
	}
	out := make([]Lease, len(ls))
	for i, l := range ls {
		out[i] = Lease(l)
	}
	return out, nil
}

// BlockedKey is a key that has parked messages. In ordered mode it is
// blocked: its later messages wait (Held) until the parked ones are
// retried or discarded.
type BlockedKey struct {
	Key string
	// Parked counts its parked messages.
	Parked int64
	// Held counts its messages set aside behind them (ordered mode).
	Held int64
	// Since is when the first of its parked messages was parked.
	Since time.Time
}

// BlockedKeys lists up to limit keys that have a parked message (at most
// InspectMax), the longest parked first; Stats.BlockedKeys counts them.
func (s *Store) BlockedKeys(ctx context.Context, limit int) ([]BlockedKey, error) {
	db, ops, err := s.inspect(ctx, "BlockedKeys", limit)
	if err != nil {
		return nil, err
	}
	ks, err := ops.blockedKeys(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing the blocked keys of %s: %w", s.t.full, err)
	}
	out := make([]BlockedKey, len(ks))
	for i, k := range ks {
		out[i] = BlockedKey(k)
	}
	return out, nil
}

// MessageState is what a pending message waits for.
type MessageState string

// The states of a pending message (QueuedMessage.State).
const (
	StateReady    MessageState = backend.StateReady    // a relay may claim it now
	StateInFlight MessageState = backend.StateInFlight // claimed, its lease not expired
	StateRetrying MessageState = backend.StateRetrying // failed, waiting out its backoff
	StateHeld     MessageState = backend.StateHeld     // set aside behind a failed message of its key (ordered mode)
	StateParked   MessageState = backend.StateParked   // out of attempts, until an operator acts
)

// QueuedMessage is a pending message of a key's queue, with its state.
type QueuedMessage struct {
	Message
	State MessageState
}

// KeyQueue lists up to limit unpublished messages of key (at most
// InspectMax) in the order ordered mode publishes them, each with its
// state. On the log layout it lists those of the key that failed or wait
// behind one that did (the failed table): its events table has no index
// by key, so messages no claim has taken yet are not listed there.
func (s *Store) KeyQueue(ctx context.Context, key string, limit int) ([]QueuedMessage, error) {
	if key == "" {
		return nil, fmt.Errorf("outbox: KeyQueue: the key is empty (messages without a key have no order)")
	}
	db, ops, err := s.inspect(ctx, "KeyQueue", limit)
	if err != nil {
		return nil, err
	}
	q, err := ops.keyQueue(ctx, db, key, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing the queue of key %q in %s: %w", key, s.t.full, err)
	}
	return q, nil
}

// PublishedByMinute counts the messages published in each of the last
// minutes minutes (1 to 1,440), by the database's clock: [0] is the last
// 60 seconds, [1] the minute before. Discarded messages are not counted.
// On the log layout it counts what the settle table still records
// (Maintain rotates it), as Stats.PublishedLastHour does.
func (s *Store) PublishedByMinute(ctx context.Context, minutes int) ([]int64, error) {
	if minutes < 1 || minutes > 1440 {
		return nil, fmt.Errorf("outbox: PublishedByMinute: minutes must be 1 to 1440 (got %d)", minutes)
	}
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return nil, err
	}
	n, err := ops.publishedByMinute(ctx, db, minutes)
	if err != nil {
		return nil, fmt.Errorf("outbox: counting published messages of %s by minute: %w", s.t.full, err)
	}
	return n, nil
}

// inspect checks an inspection's limit and returns the pool and the
// table's operations.
func (s *Store) inspect(ctx context.Context, what string, limit int) (*sql.DB, layoutOps, error) {
	if limit < 1 || limit > InspectMax {
		return nil, nil, fmt.Errorf("outbox: %s: limit must be 1 to %d (got %d)", what, InspectMax, limit)
	}
	return s.dbOps(ctx)
}

// HeldQuery selects held messages for FindHeld. Its empty fields match
// every message.
type HeldQuery struct {
	// Limit is the most messages returned (1 to InspectMax).
	Limit int
	// EventType and Key, when set, match exactly.
	EventType, Key string
	// CreatedBefore, when set, keeps the messages written no later.
	CreatedBefore time.Time
	// After, when set, is the last message of the previous page (as
	// FindHeld returned it): the page starts after it.
	After *Message
}

// FindHeld returns the held messages q selects (on an ordered table, those
// set aside behind a failed message of their key: they come back when it
// is published, retried or discarded), in the order they were written, a
// page at a time: pass the last message of a page as the next query's
// After. On the log layout it lists those a claim has set aside; messages
// of a blocked key no claim has reached yet are not listed (see
// KeyQueue).
func (s *Store) FindHeld(ctx context.Context, q HeldQuery) ([]Message, error) {
	db, ops, err := s.inspect(ctx, "FindHeld", q.Limit)
	if err != nil {
		return nil, err
	}
	bq := backend.HeldQuery{Limit: q.Limit, EventType: q.EventType, Key: q.Key}
	if !q.CreatedBefore.IsZero() {
		bq.CreatedBefore = q.CreatedBefore.UnixMicro()
	}
	if q.After != nil {
		bq.AfterSeq = q.After.Seq
	}
	msgs, err := ops.held(ctx, db, bq)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing the held messages of %s: %w", s.t.full, err)
	}
	return msgs, nil
}

// queueOps' inspections are the backend's.

func (o queueOps) leases(ctx context.Context, db *sql.DB, limit int) ([]backend.Lease, error) {
	return o.q.Leases(ctx, db, limit)
}

func (o queueOps) blockedKeys(ctx context.Context, db *sql.DB, limit int) ([]backend.BlockedKey, error) {
	return o.q.BlockedKeys(ctx, db, limit)
}

func (o queueOps) keyQueue(ctx context.Context, db *sql.DB, key string, limit int) ([]QueuedMessage, error) {
	rows, err := o.q.KeyQueue(ctx, db, key, limit)
	if err != nil {
		return nil, err
	}
	out := make([]QueuedMessage, len(rows))
	for i, r := range rows {
		out[i] = QueuedMessage{Message: fromRow(r), State: MessageState(r.State)}
	}
	return out, nil
}

func (o queueOps) publishedByMinute(ctx context.Context, db *sql.DB, minutes int) ([]int64, error) {
	return o.q.PublishedByMinute(ctx, db, minutes)
}

// SchemaVersion says which of the migrations of the table's layout (and
// database) the table has: the number of the newest one applied, as the
// files of Migrations number them, and the latest. A table behind the
// latest works, without what the later migrations bring (delayed
// messages: 000002 of the log layout and of MySQL's, 000003 of the rows
// layout); `outbox schema --apply` brings it up to date.
func (s *Store) SchemaVersion(ctx context.Context) (version, latest int, err error) {
	db, err := s.pool()
	if err != nil {
		return 0, 0, err
	}
	version, latest, err = s.st.schemaVersion(ctx, db)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: reading the schema version of %s: %w", s.t.full, err)
	}
	return version, latest, nil
}

func (st backendStorage) schemaVersion(ctx context.Context, db *sql.DB) (int, int, error) {
	return st.b.be.SchemaVersion(ctx, db)
}

// schemaVersion on PostgreSQL: the log layout's 000001 makes the table and
// 000002 its table of delayed messages; the rows layout's 000002 numbers
// its messages (seq) and 000003 makes the table of delayed messages.
func (s pgStorage) schemaVersion(ctx context.Context, db *sql.DB) (int, int, error) {
	l, err := s.layout(ctx)
	if err != nil {
		return 0, 0, err
	}
	var seq, scheduled bool
	if err := db.QueryRowContext(ctx, `SELECT
	EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'seq' AND NOT attisdropped),
	to_regclass($2) IS NOT NULL`, s.t.quoted, s.t.scheduledTable()).Scan(&seq, &scheduled); err != nil {
		return 0, 0, err
	}
	if l == LayoutLog {
		return 1 + btoi(scheduled), 2, nil
	}
	v := 1 + btoi(seq)
	if seq && scheduled {
		v = 3
	}
	return v, 3, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (o queueOps) held(ctx context.Context, db *sql.DB, q backend.HeldQuery) ([]Message, error) {
	rows, err := o.q.Held(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return fromRows(rows), nil
}
