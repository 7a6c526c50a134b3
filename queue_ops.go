package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/textcut"
)

// queueOps is the part of layoutOps that a backend.Queue does: the
// store's contract over one table, kept by the backend of the table's kind
// (package pgrows for PostgreSQL's rows layout, package mysqlstore for
// MySQL's tables). It turns the backend's rows into Messages, parks what
// cannot be relayed as written, reports lost leases and names the table
// in its errors; the SQL is the backend's.
type queueOps struct {
	*Store
	q backend.Queue
}

// queueClaim is the claim a backend made, as a Message carries it.
type queueClaim struct{ c backend.Claim }

func (queueClaim) claimRef() {}

// fromRow is the Message of a backend's row: headers decoded (a row that
// cannot be relayed as written is unfit).
func fromRow(r backend.Row) Message {
	m := Message{ID: r.ID, Seq: r.Seq, EventType: r.EventType, Key: r.Key, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
		Payload: r.Payload, ContentType: r.ContentType, CreatedAt: r.CreatedAt, Attempts: r.Attempts, LastError: r.LastError,
		ClaimedUntil: r.ClaimedUntil, ParkedAt: r.ParkedAt, NotBefore: r.Due, unfit: r.Unfit}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	if m.unfit == "" {
		m.decodeHeaders(r.Headers)
	}
	if r.Claim != nil {
		m.claim = queueClaim{r.Claim}
	}
	return m
}

func fromRows(rows []backend.Row) []Message {
	msgs := make([]Message, len(rows))
	for i, r := range rows {
		msgs[i] = fromRow(r)
	}
	return msgs
}

func refOf(m Message) backend.Ref { return backend.Ref{ID: m.ID, Seq: m.Seq, Key: m.Key} }

// ordered says whether claims keep each key's order now.
func (o queueOps) ordered() bool { return o.Ordering() == OrderedByKey }

func (o queueOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	ordered := o.ordered()
	rows, c, err := o.q.Claim(ctx, db, n, lease, o.batchMaxBytes, ordered)
	if err != nil {
		o.giveBackClaims(ctx, db, err, c)
		return nil, o.relayout(err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if f, ok := rows[len(rows)-1].Claim.(backend.OrderFinder); ok && f.FoundOrdered() && !ordered {
		// The table was made ordered since the store last read its mode:
		// the relay publishes this claim in ordered mode.
		o.order.observe(OrderedByKey)
		ordered = true
	}
	msgs := make([]Message, 0, len(rows))
	for _, r := range rows {
		if r.Parked { // parked by the claim: reported, not relayed
			o.warnParked(ctx, r.ID, r.Attempts, r.LastError)
			continue
		}
		msgs = append(msgs, fromRow(r))
	}
	if msgs, err = o.parkUnfit(ctx, db, msgs, ordered); err != nil {
		claims := make([]backend.Claim, 0, 1)
		for _, r := range rows {
			if len(claims) == 0 || claims[len(claims)-1] != r.Claim {
				claims = append(claims, r.Claim)
			}
		}
		o.giveBackClaims(ctx, db, err, claims...)
		return nil, o.relayout(err)
	}
	return msgs, nil
}

// giveBackClaims gives back at once what claims took, when the backend
// can, after a claim failed with err: a claim whose caller gets an error
// may have committed all the same (see backend.GiveBack).
func (o queueOps) giveBackClaims(ctx context.Context, db *sql.DB, err error, claims ...backend.Claim) {
	gb, ok := o.q.(backend.GiveBacker)
	if !ok {
		return
	}
	for _, c := range claims {
		if c != nil {
			backend.GiveBack(ctx, o.logger, o.t.full, func(ctx context.Context) (int64, error) { return gb.GiveBack(ctx, db, c) }, err, false)
		}
	}
}

// parkUnfit parks, each under the claim that took it, the claimed
// messages that cannot be relayed as written, and returns the others.
// When ordered, the later messages of a parked one's key are held behind
// it (Fail holds them) and given back.
func (o queueOps) parkUnfit(ctx context.Context, db *sql.DB, msgs []Message, ordered bool) ([]Message, error) {
	if !slices.ContainsFunc(msgs, func(m Message) bool { return m.unfit != "" }) {
		return msgs, nil // the claim's common case: nothing to look up
	}
	byID := make(map[string]Message, len(msgs))
	for _, m := range msgs {
		byID[m.ID] = m
	}
	claimOf := func(m Message) backend.Claim {
		c, _ := m.claim.(queueClaim)
		return c.c
	}
	return o.parkEach(ctx, msgs, ordered,
		func(id, reason string) (int, error) {
			m := byID[id]
			f, ok, err := o.q.Fail(ctx, db, refOf(m), claimOf(m), reason, 0, 1, ordered)
			if err == nil && !ok {
				err = sql.ErrNoRows
			}
			return f.Attempts, err
		},
		func(ids []string) error { // behind a parked one of their key
			var (
				claims []backend.Claim
				of     = map[backend.Claim][]backend.Ref{}
			)
			for _, id := range ids {
				c := claimOf(byID[id])
				if _, ok := of[c]; !ok {
					claims = append(claims, c)
				}
				of[c] = append(of[c], refOf(byID[id]))
			}
			for _, c := range claims {
				if _, err := o.q.Settle(ctx, db, false, c, of[c], ordered); err != nil {
					return err
				}
			}
			return nil
		})
}

// settle settles the messages of each claim together and reports those
// the backend did not mark as lost leases.
func (o queueOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	var (
		claims []queueClaim // in order of first appearance
		of     = map[queueClaim][]int{}
		done   = make([]bool, len(msgs))
	)
	for i, m := range msgs {
		c, ok := m.claim.(queueClaim)
		if !ok {
			continue // claimed from a table of another kind: lost below
		}
		if _, ok := of[c]; !ok {
			claims = append(claims, c)
		}
		of[c] = append(of[c], i)
	}
	for _, c := range claims {
		refs := make([]backend.Ref, len(of[c]))
		for j, i := range of[c] {
			refs[j] = refOf(msgs[i])
		}
		marked, err := o.q.Settle(ctx, db, kind == 'p', c.c, refs, o.ordered())
		if err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), o.t.full, o.relayout(err))
		}
		for _, j := range marked {
			done[of[c][j]] = true
		}
	}
	var lost []string
	for i, m := range msgs {
		if !done[i] {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return o.leaseLost(ctx, what, lost)
}

func (o queueOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	c, ok := msg.claim.(queueClaim)
	if !ok { // claimed from a table of another kind
		return o.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	reason = textcut.Cut(strings.ReplaceAll(reason, "\x00", ""), lastErrorMax) // a NUL cannot be stored
	f, ok, err := o.q.Fail(ctx, db, refOf(msg), c.c, reason, o.backoff(msg.Attempts+1), o.maxAttempts, o.ordered())
	switch {
	case err != nil:
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, o.t.full, o.relayout(err))
	case !ok:
		return o.leaseLost(ctx, "marking failed", []string{msg.ID})
	case f.Parked:
		o.warnParked(ctx, msg.ID, f.Attempts, reason)
	}
	return nil
}

func (o queueOps) maintain(ctx context.Context, db *sql.DB) error {
	if err := o.q.Maintain(ctx, db); err != nil {
		return fmt.Errorf("outbox: maintaining %s: %w", o.t.full, err)
	}
	return nil
}

func (o queueOps) pending(ctx context.Context, db *sql.DB) (int64, error) {
	n, err := o.q.Pending(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting pending messages in %s: %w", o.t.full, err)
	}
	return n, nil
}

func (o queueOps) stats(ctx context.Context, db *sql.DB) (Stats, error) {
	c, err := o.q.Counts(ctx, db, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: reading stats of %s: %w", o.t.full, err)
	}
	st := Stats{Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, PublishedLastHour: c.PublishedLastHour, BlockedKeys: c.BlockedKeys}
	st.Pending = st.Ready + st.InFlight + st.Retrying + st.Held + st.Parked
	st.Claimed = st.InFlight
	return st, nil
}

func (o queueOps) gauges(ctx context.Context, db *sql.DB, limit int64) (Gauges, error) {
	c, err := o.q.Counts(ctx, db, limit)
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox: reading gauges of %s: %w", o.t.full, err)
	}
	g := Gauges{Limit: limit, Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, BlockedKeys: c.BlockedKeys}
	g.Pending = min(g.Ready+g.InFlight+g.Retrying+g.Held+g.Parked, limit)
	return g, nil
}

func (o queueOps) parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]Message, error) {
	rows, err := o.q.Parked(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return fromRows(rows), nil
}

func (o queueOps) changeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	return o.q.ChangeParked(ctx, db, discard, ids)
}

func (o queueOps) reconcile(ctx context.Context, db *sql.DB) (held, unheld int64, err error) {
	held, unheld, err = o.q.Reconcile(ctx, db, o.ordered())
	if err != nil {
		return held, unheld, fmt.Errorf("outbox: reconciling %s: %w", o.t.full, err)
	}
	return held, unheld, nil
}

func (o queueOps) purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error) {
	n, err := o.q.Purge(ctx, db, olderThan, o.purgeBatch, progress)
	if err != nil {
		return n, fmt.Errorf("outbox: purging published messages in %s: %w", o.t.full, err)
	}
	return n, nil
}

func (o queueOps) purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	n, err := o.q.Purgeable(ctx, db, olderThan)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", o.t.full, err)
	}
	return n, nil
}

func (queueOps) orderColumn() string { return "seq" }
