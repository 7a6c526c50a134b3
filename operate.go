package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/pgschema"
)

// Pending returns how many messages wait to be published: every message
// not yet published nor discarded, whatever it waits for. Ready, claimed
// (in flight), backing off (retrying), held behind a failed message of their
// key and parked ones (which exhausted their attempts and wait for an
// operator) are all counted, as the store's contract says. The views that
// tell them apart are Stats' and Gauges' Ready, InFlight, Retrying, Held and
// Parked, which add up to Pending; Pending means this everywhere: Stats,
// Gauges, the metrics (outbox.pending) and `outbox status`. To alert on
// messages that should be moving, watch Ready and OldestReadyAge, which
// leave parked ones out.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return 0, err
	}
	n, err := ops.pending(ctx, db)
	if err != nil {
		return 0, err
	}
	delayed, _, err := s.scheduledCounts(ctx, db, 1<<62)
	return n + delayed, err
}

// Stats is a snapshot of an outbox table for operators and metrics. Each
// message waiting to be published is in exactly one of Ready, InFlight,
// Retrying, Held, Parked and Scheduled, and Pending is their sum.
type Stats struct {
	// Pending counts the messages waiting to be published, as
	// Store.Pending does: ready, claimed, backing off, held, parked and
	// delayed ones, all of them.
	Pending int64
	// Scheduled counts the delayed messages (Event.NotBefore) not due
	// yet, or due and not yet moved into the table by Maintain, and those
	// Maintain could not move: a message of the same ID was written into
	// the table meanwhile (it stays in <table>_scheduled, with
	// last_error saying so, for an operator to delete or give a new ID).
	Scheduled int64
	// NextDue is when the next delayed message is due, on this process's
	// clock (the database's distance to it, from now); zero when none
	// waits.
	NextDue time.Time
	// Ready counts the messages a relay may claim now: neither claimed,
	// backing off, held nor parked. On a healthy table it stays near
	// zero; the alert on messages that should be moving watches it (and
	// OldestReadyAge).
	Ready int64
	// InFlight counts messages under a claim whose lease has not expired:
	// a relay is publishing them.
	InFlight int64
	// Claimed is InFlight.
	//
	// Deprecated: use InFlight.
	Claimed int64
	// Retrying counts messages that failed and wait out their backoff
	// before they may be claimed again.
	Retrying int64
	// Held counts the messages set aside, on an ordered table, behind a
	// message of their key that failed (parked or backing off); they come
	// back when it is published, retried or discarded.
	Held int64
	// Parked counts messages that exhausted their attempts: they are
	// never claimed again until an operator retries (or discards) them.
	Parked int64
	// OldestPendingAge is how long the oldest pending message (parked ones
	// included) has been waiting; zero when nothing is pending.
	OldestPendingAge time.Duration
	// OldestReadyAge is how long the oldest ready message has been
	// waiting; zero when none is ready.
	OldestReadyAge time.Duration
	// PublishedLastHour counts messages published in the last hour.
	PublishedLastHour int64
	// BlockedKeys counts the keys that have a parked message. In ordered
	// mode each is blocked: its later messages wait until the parked one
	// is retried or discarded (Retry, Discard).
	BlockedKeys int64
}

// Stats returns counts of the table's messages by state.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return Stats{}, err
	}
	st, err := ops.stats(ctx, db)
	if err != nil {
		return st, err
	}
	st.Scheduled, st.NextDue, err = s.scheduledCounts(ctx, db, 1<<62)
	st.Pending += st.Scheduled
	return st, err
}

// Parked returns up to limit parked messages, the most recently parked
// first, with their attempt counts and last errors.
func (s *Store) Parked(ctx context.Context, limit int) ([]Message, error) {
	if limit < 1 {
		return nil, fmt.Errorf("outbox: Parked: limit must be at least 1 (got %d)", limit)
	}
	return s.findParked(ctx, ParkedQuery{Limit: limit})
}

// ParkedQuery selects parked messages for FindParked. Its empty fields
// match every message.
type ParkedQuery struct {
	// Limit is the most messages returned (at least 1, at most
	// ParkedQueryMax).
	Limit int
	// EventType and Key, when set, match exactly.
	EventType, Key string
	// ErrorText, when set, is a part of the message's last error.
	ErrorText string
	// After continues a listing: the last message of the previous page
	// (its ParkedAt and Seq); only the messages after it in the list's
	// order are returned. Nil: from the most recently parked.
	After *Message
}

// ParkedQueryMax is the largest ParkedQuery.Limit.
const ParkedQueryMax = 1000

// FindParked returns the parked messages q selects, the most recently
// parked first (then by Seq, descending): a page of a listing that stays
// as cheap at its thousandth page as at its first on a table of millions
// of messages, since each page starts from where the last one ended.
func (s *Store) FindParked(ctx context.Context, q ParkedQuery) ([]Message, error) {
	if q.Limit < 1 || q.Limit > ParkedQueryMax {
		return nil, fmt.Errorf("outbox: FindParked: limit must be from 1 to %d (got %d)", ParkedQueryMax, q.Limit)
	}
	return s.findParked(ctx, q)
}

func (s *Store) findParked(ctx context.Context, q ParkedQuery) ([]Message, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	bq := backend.ParkedQuery{Limit: q.Limit, EventType: q.EventType, Key: q.Key, ErrorText: q.ErrorText}
	if q.After != nil {
		if q.After.ParkedAt.IsZero() {
			return nil, fmt.Errorf("outbox: FindParked: After is not a parked message (its ParkedAt is zero)")
		}
		bq.AfterParkedAt, bq.AfterSeq = q.After.ParkedAt.UnixMicro(), q.After.Seq
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return nil, err
	}
	msgs, err := ops.parked(ctx, db, bq)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked messages in %s: %w", s.t.full, err)
	}
	return msgs, nil
}

// Retry re-arms parked messages: their attempt count starts again from zero
// and they can be claimed at once. Ids that are not parked are ignored. It
// returns how many messages were re-armed.
func (s *Store) Retry(ctx context.Context, ids ...string) (int64, error) {
	return s.changeParked(ctx, "Retry", "retrying parked messages", false, ids)
}

// Discard gives up on parked messages: they will never be published, and
// in ordered mode their keys are unblocked, so that the messages written
// after them go out. A discarded message is not deleted: it keeps its row,
// attempts and last error, with discarded_at set (and published_at, which
// takes it out of the outbox's work and lets PurgePublished delete it with
// the published history in time). Ids that are not parked messages are
// ignored. It returns how many messages were discarded.
func (s *Store) Discard(ctx context.Context, ids ...string) (int64, error) {
	return s.changeParked(ctx, "Discard", "discarding parked messages", true, ids)
}

// changeParked retries (or discards) the parked messages among ids and
// returns how many it changed.
func (s *Store) changeParked(ctx context.Context, op, what string, discard bool, ids []string) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	for _, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			return 0, fmt.Errorf("outbox: %s: %q is not a message id (a UUID)", op, id)
		}
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return 0, err
	}
	n, err := ops.changeParked(ctx, db, discard, ids)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s in %s: %w", what, s.t.full, err)
	}
	return n, nil
}

// RetryAllParked re-arms every parked message, as Retry does, and returns how
// many there were.
func (s *Store) RetryAllParked(ctx context.Context) (int64, error) {
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return 0, err
	}
	n, err := ops.changeParked(ctx, db, false, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: retrying parked messages in %s: %w", s.t.full, err)
	}
	return n, nil
}

// Reconcile keeps the held messages of ordered mode true: it holds the
// waiting messages of keys whose first unpublished message has failed
// (messages written after it failed), and brings back the held messages of
// keys whose first message has not. Holding keeps claims from walking over
// the messages of blocked keys; what a claim may take is decided by the
// claim itself, so Reconcile is about speed and never about order.
// Publishing, retrying and discarding a message bring the messages held
// behind it back at once; Reconcile is the safety net, and relays call it
// every second while the table is ordered. On an unordered table (as the
// store last read its mode) it only brings back what ordered mode held
// before, and relays call it once when they start or the table turns
// unordered. It returns how many messages it held and brought back. On a
// table of LayoutLog, which holds nothing, it does nothing.
func (s *Store) Reconcile(ctx context.Context) (held, unheld int64, err error) {
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return 0, 0, err
	}
	return ops.reconcile(ctx, db)
}

// PurgePublished deletes published messages older than olderThan and
// returns how many it deleted. Unpublished messages are never touched. It
// works in batches of StoreConfig.PurgeBatchSize rows, one short statement
// each, so that a large purge neither locks much at once nor holds one long
// transaction; cancelling ctx stops it between batches, keeping what was
// deleted so far.
//
// Nothing else deletes published rows. How long to keep them is a question of
// auditing rather than messaging, so the caller decides.
func (s *Store) PurgePublished(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.PurgePublishedProgress(ctx, olderThan, nil)
}

// PurgePublishedProgress is PurgePublished that calls progress with the
// running total after every batch.
func (s *Store) PurgePublishedProgress(ctx context.Context, olderThan time.Duration, progress func(deleted int64)) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: PurgePublished: age must not be negative (got %s)", olderThan)
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return 0, err
	}
	return ops.purge(ctx, db, olderThan, progress)
}

// CreateSchemaIfAbsent creates the outbox table in the default layout,
// LayoutLog (as CreateLogSchemaIfAbsent does), if it does not exist yet. A
// table that exists keeps its layout and is brought up to date in it: one
// of LayoutRows as by CreateRowsSchemaIfAbsent, one of LayoutLog as by
// CreateLogSchemaIfAbsent. A store in ordered mode (StoreConfig.Ordering)
// makes the table ordered if it is not.
//
// It is meant for development and tests. In production the table belongs to
// the migrations that own the rest of your schema (see Migrations, Schema,
// and `outbox schema`): when your database changes is not a library's
// decision to take at start-up.
func (s *Store) CreateSchemaIfAbsent(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	return s.st.createSchema(ctx, db)
}

// CreateRowsSchemaIfAbsent creates the outbox table in LayoutRows and its
// indexes if they do not exist yet (RowsSchema), and, for a store in
// ordered mode (StoreConfig.Ordering), makes the table ordered if it is not
// (OrderSchema). On a table of LayoutLog it does nothing. Like
// CreateSchemaIfAbsent, it is meant for development and tests.
func (s *Store) CreateRowsSchemaIfAbsent(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	return s.st.createRowsSchema(ctx, db)
}

// createRowsSchema is CreateRowsSchemaIfAbsent on a table of the rows
// layout, or where there is none.
func (r rowsOps) createRowsSchema(ctx context.Context, db *sql.DB) error {
	s := r.Store
	if err := pgschema.Apply(ctx, db, "outbox:"+s.t.quoted, s.t.createSQL()+s.t.orderSQL()+s.t.scheduledSQL()); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	s.scheduledMayExist()
	if s.order.configured != OrderedByKey {
		return nil
	}
	switch o, err := s.TableOrdering(ctx); {
	case err != nil:
		return err
	case o == OrderedByKey:
		s.order.observe(o)
		return nil
	}
	if err := pgschema.Apply(ctx, db, "outbox:"+s.t.quoted, s.t.orderTriggerSQL()); err != nil {
		return fmt.Errorf("outbox: making %s an ordered table: %w", s.t.full, err)
	}
	s.order.observe(OrderedByKey)
	return nil
}

// Purgeable counts the published messages older than olderThan: what
// PurgePublished would delete now. Operators see it before they purge.
func (s *Store) Purgeable(ctx context.Context, olderThan time.Duration) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: Purgeable: age must not be negative (got %s)", olderThan)
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return 0, err
	}
	return ops.purgeable(ctx, db, olderThan)
}

// GaugesLimitDefault bounds the counts of Store.Gauges.
const GaugesLimitDefault = 100_000

// Gauges is a snapshot of an outbox table cheap enough to take on every
// metrics scrape, however large the table: each figure is read from a
// partial index, and the counts stop at a limit. Its counts mean what those
// of Stats do: Ready, InFlight, Retrying, Held, Parked and Scheduled add up
// to Pending (each count, Pending too, stopping at the limit).
type Gauges struct {
	// Pending counts messages waiting to be published, as Store.Pending
	// does (ready, claimed, backing off, held, parked and delayed ones),
	// up to the limit.
	Pending int64
	// Scheduled counts delayed messages not yet moved into the table, up
	// to the limit.
	Scheduled int64
	// Ready counts the messages a relay may claim now, up to the limit.
	Ready int64
	// InFlight counts messages under an unexpired claim, up to the limit.
	InFlight int64
	// Retrying counts messages waiting out a backoff, up to the limit.
	Retrying int64
	// Held counts the messages held, on an ordered table, behind a failed
	// message of their key, up to the limit.
	Held int64
	// Parked counts parked messages, up to the limit.
	Parked int64
	// Limit is the limit the counts stop at: a count equal to it means
	// "at least".
	Limit int64
	// OldestPendingAge is how long the oldest pending message (parked ones
	// included) has been waiting, by the database clock; zero when none is.
	OldestPendingAge time.Duration
	// OldestReadyAge is how long the oldest ready message has been
	// waiting, by the database clock; zero when none is. It is what an
	// alert on messages that should be moving watches.
	OldestReadyAge time.Duration
	// BlockedKeys counts the keys of parked messages, among the first
	// limit parked messages: in ordered mode, the keys whose later
	// messages wait for an operator.
	BlockedKeys int64
}

// Gauges returns the table's counts by state, each stopping at limit
// (GaugesLimitDefault when limit < 1), the ages of the oldest pending and
// of the oldest ready message and the keys blocked by parked messages. It
// reads only the claim, held and parked partial indexes, never the
// published rows.
func (s *Store) Gauges(ctx context.Context, limit int64) (Gauges, error) {
	db, ops, err := s.dbOps(ctx)
	if err != nil {
		return Gauges{}, err
	}
	if limit < 1 {
		limit = GaugesLimitDefault
	}
	g, err := ops.gauges(ctx, db, limit)
	if err != nil {
		return g, err
	}
	g.Scheduled, _, err = s.scheduledCounts(ctx, db, limit)
	g.Pending = min(g.Pending+g.Scheduled, limit)
	return g, err
}

// HasNotifyTrigger reports whether the table has the LISTEN/NOTIFY trigger
// of NotifySchema, without which LISTEN wakes nothing.
func (s *Store) HasNotifyTrigger(ctx context.Context) (bool, error) {
	db, err := s.pool()
	if err != nil {
		return false, err
	}
	return s.st.hasNotifyTrigger(ctx, db)
}
