package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/acemq/outbox/internal/backend"
)

func (s *Store) pool() (*sql.DB, error) {
	if s.db == nil {
		return nil, ErrNoPool
	}
	return s.db, nil
}

// Claim takes up to n messages that are ready to publish and leases them to
// the caller for the given duration, by the database clock. It returns them
// oldest first, and an empty slice when there is nothing to do.
//
// On a table of LayoutLog, a claim that takes over the batch of a relay
// whose lease ran out takes all of it, which can be more than n when that
// relay claimed with a larger n.
//
// A claim stops short of n messages when their payloads and headers would
// exceed StoreConfig.BatchMaxBytes; it always returns at least one message
// when one is ready, however large.
//
// A claim is a lease, not a lock: no transaction stays open, and if the
// claimer dies the rows become claimable again when the lease ends. The lease
// must therefore be comfortably longer than publishing a batch takes, and no
// longer than a stalled message may wait. Each call takes a fresh claim
// token, which MarkPublished, MarkFailed and Release check.
func (s *Store) Claim(ctx context.Context, n int, lease time.Duration) ([]Message, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("outbox: Claim: batch size must be at least 1 (got %d)", n)
	}
	if lease < time.Millisecond {
		return nil, fmt.Errorf("outbox: Claim: lease must be at least 1ms (got %s)", lease)
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return nil, err
	}
	msgs, err := ops.claim(ctx, db, n, lease)
	if err != nil {
		return nil, fmt.Errorf("outbox: claiming from %s: %w", s.t.full, s.leaveReadOnly(ctx, db, err))
	}
	return msgs, nil
}

// leaveReadOnly returns err, and when it says that the server accepts no
// writes (an old primary fenced by a failover, a replica), first closes
// the pool's idle connections to such a server (see package dbpool): the
// pool then connects again, and a URL that lists every host with
// target_session_attrs=read-write finds the new primary. Without it, a
// pool kept failing on the old primary for as long as it stayed up.
func (s *Store) leaveReadOnly(ctx context.Context, db *sql.DB, err error) error {
	if n := s.readOnly.After(ctx, db, s.database == MySQL, err); n > 0 {
		s.logger.WarnContext(ctx, "outbox: Closed connections to a server that accepts no writes, to connect again",
			slog.Int("num_closed", n))
	}
	return err
}

// decodeHeaders sets m.Headers from the jsonb of its row ('{}': none), or
// m.unfit when they are not what Add writes: an object of string values
// whose names Add accepts.
func (m *Message) decodeHeaders(raw []byte) {
	if len(raw) <= 2 {
		return
	}
	if err := json.Unmarshal(raw, &m.Headers); err != nil {
		m.Headers, m.unfit = nil, fmt.Sprintf("decoding headers of message %s: %v", m.ID, err)
		return
	}
	for k, v := range m.Headers {
		if fault := headerFault(k, v); fault != "" {
			m.Headers, m.unfit = nil, fmt.Sprintf("headers of message %s: %s", m.ID, fault)
			return
		}
	}
}

// unfitReason is the last error of a message parked because its row
// cannot be relayed as written.
func unfitReason(m Message) string { return backend.UnfitReason(m.unfit) }

// headersUnfit says why headers as stored cannot be relayed, "" when they
// can (see decodeHeaders): package pglog's claims ask it.
func headersUnfit(id string, raw []byte) string {
	m := Message{ID: id}
	m.decodeHeaders(raw)
	return m.unfit
}

// parkEach parks with park, one at a time, the messages of a claim that
// cannot be relayed as written, gives back with giveBack those that wait
// behind them (ordered), and returns the others. A park that finds no row
// (the lease ran out already) leaves the message to the next claim.
func (s *Store) parkEach(ctx context.Context, msgs []Message, ordered bool, park func(id, reason string) (int, error), giveBack func(ids []string) error) ([]Message, error) {
	kept, unfit, behind := splitUnfit(msgs, ordered)
	for _, m := range unfit {
		reason := unfitReason(m)
		attempts, err := park(m.ID, reason)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parking message %s, which cannot be relayed as written: %w", m.ID, err)
		}
		s.warnParked(ctx, m.ID, attempts, reason)
	}
	if len(behind) > 0 {
		ids := make([]string, len(behind))
		for i, m := range behind {
			ids[i] = m.ID
		}
		if err := giveBack(ids); err != nil {
			return nil, fmt.Errorf("giving back %d message(s) held behind a parked one: %w", len(ids), err)
		}
	}
	return kept, nil
}

// splitUnfit splits msgs, in the order of the claim, into those to
// return, those that cannot be relayed as written, and, when ordered,
// those after one of those of its key, which wait behind it.
func splitUnfit(msgs []Message, ordered bool) (kept, unfit, behind []Message) {
	var keys map[string]bool
	for i, m := range msgs {
		switch {
		case m.unfit != "":
			if kept == nil {
				kept = append(make([]Message, 0, len(msgs)), msgs[:i]...)
			}
			unfit = append(unfit, m)
			if ordered && m.Key != "" {
				if keys == nil {
					keys = map[string]bool{}
				}
				keys[m.Key] = true
			}
		case keys[m.Key]:
			behind = append(behind, m)
		case kept != nil:
			kept = append(kept, m)
		}
	}
	if kept == nil && unfit == nil {
		return msgs, nil, nil
	}
	return kept, unfit, behind
}

// MarkPublished records that the messages reached the broker. It changes
// only rows that still carry the caller's claim; the others are reported in
// a *LeaseLostError (errors.Is(err, ErrLeaseLost)) after the rest have been
// marked. Such a message was claimed again by another relay, which may
// publish it a second time: a duplicate, never a loss.
func (s *Store) MarkPublished(ctx context.Context, msgs ...Message) error {
	return s.settle(ctx, "marking published", 'p', msgs)
}

// Release gives claims back without counting an attempt: the messages can be
// claimed again at once. A relay releases what it claimed but did not get to
// publish (shutdown, broker outage). Rows no longer carrying the caller's
// claim are left alone and reported like MarkPublished does.
func (s *Store) Release(ctx context.Context, msgs ...Message) error {
	return s.settle(ctx, "releasing", 'r', msgs)
}

// settle records what became of claimed messages: kind 'p' (published)
// or 'r' (released), and reports those whose claim was lost.
func (s *Store) settle(ctx context.Context, what string, kind byte, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.claim == nil {
			return fmt.Errorf("outbox: %s message %s: it was not returned by Claim, so it carries no claim", what, m.ID)
		}
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return err
	}
	return s.leaveReadOnly(ctx, db, ops.settle(ctx, db, what, kind, msgs))
}

// leaseLost logs and returns the error for messages whose claim was lost.
func (s *Store) leaseLost(ctx context.Context, what string, ids []string) error {
	s.logger.WarnContext(ctx, "outbox: Lease lost", slog.String("table", s.t.full),
		slog.String("operation", what), slog.Int("num_lost", len(ids)), slog.String("first_id", ids[0]))
	return &LeaseLostError{IDs: ids}
}

// MarkFailed records a failed attempt to publish msg: it adds one to the
// attempt count, keeps reason for whoever reads the table, releases the claim
// and makes the message claimable again after the store's backoff. The
// attempt that reaches MaxAttempts parks the message instead: it stays in the
// table, counted by Pending and listed by Parked, until Retry re-arms it.
//
// Only a message that is the message's fault should be marked failed; when
// the broker is down, Release it so that no attempt is burnt. Like
// MarkPublished, MarkFailed leaves alone a row whose claim was lost and
// returns a *LeaseLostError.
func (s *Store) MarkFailed(ctx context.Context, msg Message, reason string) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if msg.claim == nil {
		return fmt.Errorf("outbox: marking message %s failed: it was not returned by Claim, so it carries no claim", msg.ID)
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return err
	}
	return s.leaveReadOnly(ctx, db, ops.markFailed(ctx, db, msg, reason))
}

func (s *Store) warnParked(ctx context.Context, id string, attempts int, reason string) {
	s.logger.WarnContext(ctx, "outbox: Message parked after too many failed attempts",
		slog.String("table", s.t.full), slog.String("outbox_id", id), slog.Int("attempts", attempts),
		slog.String("last_error", truncate(reason, 200)))
}

// Maintain does the upkeep a table needs beside its claims, so that claims
// need not wait for it. On a table of LayoutLog it looks for batches to take
// over (a relay's lease ran out, or it released them) and for failed
// messages due again, which the next Claim then takes, every 250ms while
// claims find work and less often while they find none; and it rotates the
// table's partitions every second. Each call does only what is due and
// returns at once when nothing is. On every table it moves the delayed
// messages that are due (Event.NotBefore) into the table, up to 5,000 a
// call, and wakes this process's relays when it moved some, unless
// something calls MoveDue (a relay does); only these two move them, so a
// claim loop of your own must call one of them for them to go out. On a
// table of LayoutRows it does nothing more on PostgreSQL; on MySQL it
// looks for messages ready again below where claims read from (a lease
// that ran out, a release by another process), once a second at most, and
// less often when that look is slow.
//
// A relay calls it every 100ms from a goroutine of its own. While something
// calls it, claims leave this work to it; a claim loop of your own that
// never calls it has its claims do it, as due, and a message committed
// meanwhile waits for it.
func (s *Store) Maintain(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	ops, err := s.ops(ctx)
	if err != nil {
		return err
	}
	if err := s.moveDueIfNoMover(ctx, db); err != nil {
		return s.leaveReadOnly(ctx, db, err)
	}
	return s.leaveReadOnly(ctx, db, ops.maintain(ctx, db))
}
