package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/mysqlstore"
	"github.com/acemq/outbox/internal/textcut"
)

// backendClaim is the claim a backend wrote in the rows it claimed.
type backendClaim string

func (backendClaim) claimRef() {}

// backendOps is a table kept by a backend of package backend: MySQL's.
type backendOps struct{ *Store }

// fromRow is the Message of a backend's row: headers decoded (a row that
// cannot be relayed as written is unfit).
func fromRow(r backend.Row) Message {
	m := Message{ID: r.ID, Seq: r.Seq, EventType: r.EventType, Key: r.Key, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
		Payload: r.Payload, ContentType: r.ContentType, CreatedAt: r.CreatedAt, Attempts: r.Attempts, LastError: r.LastError,
		ClaimedUntil: r.ClaimedUntil, ParkedAt: r.ParkedAt, NotBefore: r.Due}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	m.decodeHeaders(r.Headers)
	return m
}

func fromRows(rows []backend.Row, claimed bool) []Message {
	msgs := make([]Message, len(rows))
	for i, r := range rows {
		msgs[i] = fromRow(r)
		if claimed {
			msgs[i].claim = backendClaim(r.Claim)
		}
	}
	return msgs
}

// ordered says whether claims keep each key's order now.
func (b backendOps) ordered() bool { return b.Ordering() == OrderedByKey }

func (b backendOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	ordered := b.ordered()
	rows, err := b.be.Claim(ctx, db, n, lease, b.batchMaxBytes, ordered)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	msgs := fromRows(rows, true)
	token := rows[0].Claim
	return b.parkEach(ctx, msgs, ordered,
		func(id, reason string) (int, error) {
			f, ok, err := b.be.Fail(ctx, db, refOf(msgs, id), token, reason, 0, 1, ordered)
			if err == nil && !ok {
				err = sql.ErrNoRows
			}
			return f.Attempts, err
		},
		func(ids []string) error { // behind a parked one of their key
			refs := make([]backend.Ref, len(ids))
			for i, id := range ids {
				refs[i] = refOf(msgs, id)
			}
			_, err := b.be.Settle(ctx, db, false, token, refs, ordered)
			return err
		})
}

func refOf(msgs []Message, id string) backend.Ref {
	for _, m := range msgs {
		if m.ID == id {
			return backend.Ref{Seq: m.Seq, Key: m.Key}
		}
	}
	return backend.Ref{}
}

func (b backendOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	var (
		claims []backendClaim // in order of first appearance
		refs   = map[backendClaim][]backend.Ref{}
		done   = make(map[int64]bool, len(msgs))
	)
	for _, m := range msgs {
		c, ok := m.claim.(backendClaim)
		if !ok {
			continue // claimed from another table's kind: lost below
		}
		if _, ok := refs[c]; !ok {
			claims = append(claims, c)
		}
		refs[c] = append(refs[c], backend.Ref{Seq: m.Seq, Key: m.Key})
	}
	for _, c := range claims {
		marked, err := b.be.Settle(ctx, db, kind == 'p', string(c), refs[c], b.ordered())
		if err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), b.t.full, err)
		}
		for _, q := range marked {
			done[q] = true
		}
	}
	var lost []string
	for _, m := range msgs {
		if _, ok := m.claim.(backendClaim); !ok || !done[m.Seq] {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return b.leaseLost(ctx, what, lost)
}

func (b backendOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	c, ok := msg.claim.(backendClaim)
	if !ok {
		return b.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	reason = textcut.Cut(strings.ReplaceAll(reason, "\x00", ""), lastErrorMax)
	f, ok, err := b.be.Fail(ctx, db, backend.Ref{Seq: msg.Seq, Key: msg.Key}, string(c), reason, b.backoff(msg.Attempts+1), b.maxAttempts, b.ordered())
	switch {
	case err != nil:
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, b.t.full, err)
	case !ok:
		return b.leaseLost(ctx, "marking failed", []string{msg.ID})
	case f.Parked:
		b.warnParked(ctx, msg.ID, f.Attempts, reason)
	}
	return nil
}

func (b backendOps) maintain(ctx context.Context, db *sql.DB) error {
	if err := b.be.Maintain(ctx, db); err != nil {
		return fmt.Errorf("outbox: maintaining %s: %w", b.t.full, err)
	}
	return nil
}

func (b backendOps) pending(ctx context.Context, db *sql.DB) (int64, error) {
	n, err := b.be.Pending(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting pending messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (b backendOps) stats(ctx context.Context, db *sql.DB) (Stats, error) {
	c, err := b.be.Counts(ctx, db, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: reading stats of %s: %w", b.t.full, err)
	}
	st := Stats{Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, PublishedLastHour: c.PublishedLastHour, BlockedKeys: c.BlockedKeys}
	st.Pending = st.Ready + st.InFlight + st.Retrying + st.Held + st.Parked
	st.Claimed = st.InFlight
	return st, nil
}

func (b backendOps) gauges(ctx context.Context, db *sql.DB, limit int64) (Gauges, error) {
	c, err := b.be.Counts(ctx, db, limit)
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox: reading gauges of %s: %w", b.t.full, err)
	}
	g := Gauges{Limit: limit, Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, BlockedKeys: c.BlockedKeys}
	g.Pending = min(g.Ready+g.InFlight+g.Retrying+g.Held+g.Parked, limit)
	return g, nil
}

func (b backendOps) parked(ctx context.Context, db *sql.DB, q backend.ParkedQuery) ([]Message, error) {
	rows, err := b.be.Parked(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return fromRows(rows, false), nil
}

func (b backendOps) changeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	return b.be.ChangeParked(ctx, db, discard, ids)
}

func (b backendOps) reconcile(ctx context.Context, db *sql.DB) (held, unheld int64, err error) {
	held, unheld, err = b.be.Reconcile(ctx, db, b.ordered())
	if err != nil {
		return held, unheld, fmt.Errorf("outbox: reconciling %s: %w", b.t.full, err)
	}
	return held, unheld, nil
}

func (b backendOps) purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error) {
	n, err := b.be.Purge(ctx, db, olderThan, b.purgeBatch, progress)
	if err != nil {
		return n, fmt.Errorf("outbox: purging published messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (b backendOps) purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	n, err := b.be.Purgeable(ctx, db, olderThan)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (backendOps) orderColumn() string { return "seq" }

// readOrder reads whether the table is ordered (has its order trigger).
// Its order is numbered by the keys' turns, never by a sequence that
// caches: the checks of PostgreSQL's sequences pass.
func (b backendOps) readOrder(ctx context.Context, db *sql.DB) (tableOrder, error) {
	ordered, err := b.be.Ordered(ctx, db)
	if err != nil {
		return tableOrder{}, fmt.Errorf("outbox: reading the order of %s: %w", b.t.full, err)
	}
	if ordered {
		b.tm.set(OrderedByKey)
	} else {
		b.tm.set(Unordered)
	}
	return tableOrder{ordered: ordered, hasSeq: true, cache: sql.NullInt64{Int64: 1, Valid: true}}, nil
}

// takeTurns is Store.Add's lockKeys on a backend's table: the writer takes
// the turns of its keys in sorted order before it writes, so that one call
// never deadlocks by itself, when the store is ordered or the table was
// last read ordered and the call has several keys. (A writer that does not
// take them first takes them row by row in the trigger: two transactions
// writing keys A and B in opposite orders can deadlock, and MySQL aborts
// one, error 1213.)
func (b backendOps) takeTurns(ctx context.Context, tx Execer, evts []Event) error {
	if b.ordering != OrderedByKey && (len(evts) < 2 || b.Ordering() != OrderedByKey) {
		return nil
	}
	var keys []string
	for i := range evts {
		if evts[i].Key != "" {
			keys = append(keys, evts[i].Key)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if len(keys) == 0 || (len(keys) < 2 && b.ordering != OrderedByKey) {
		return nil
	}
	bind := make([]any, len(keys))
	for i, k := range keys {
		bind[i] = k
	}
	if _, err := tx.ExecContext(ctx, b.be.KeyTurnSQL(len(keys)), bind...); err != nil {
		return fmt.Errorf("outbox: taking the keys of %d event(s) in %s: %w", len(evts), b.t.full, err)
	}
	return nil
}

// errNotOnBackend is what the operations that only PostgreSQL has return
// on another database.
func (b backendOps) errNotOnBackend(what string) error {
	return fmt.Errorf("outbox: %s: %w: %s is on %s, where tables are unordered and of LayoutRows", what, ErrUnsupportedDatabase, b.t.full, b.database)
}

func (b backendOps) convertOrdering(ctx context.Context, db *sql.DB, to Ordering, dryRun bool, _ time.Duration) (OrderingConversion, error) {
	from, err := b.TableOrdering(ctx)
	if err != nil {
		return OrderingConversion{}, err
	}
	c := OrderingConversion{From: from, To: to}
	if from != to {
		stmts := b.be.UnorderStatements()
		if to == OrderedByKey {
			stmts = b.be.OrderStatements()
		}
		c.DDL = mysqlstore.Script(stmts)
	}
	st, err := b.stats(ctx, db)
	if err != nil {
		return c, err
	}
	c.Pending, c.Held = st.Pending, st.Held
	if dryRun || from == to {
		return c, nil
	}
	start := time.Now()
	if err := b.be.SetOrdered(ctx, db, to == OrderedByKey); err != nil {
		return c, fmt.Errorf("outbox: converting %s to %s: %w", b.t.full, to, err)
	}
	c.Took = time.Since(start)
	b.tm.set(to)
	return c, nil
}

func (b backendOps) createRowsSchema(ctx context.Context, db *sql.DB) error {
	for _, st := range append(b.be.SchemaStatements(), b.be.ScheduleStatements()...) {
		if _, err := db.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("outbox: creating schema of %s: %w", b.t.full, err)
		}
	}
	if b.ordering != OrderedByKey {
		return nil
	}
	if err := b.be.SetOrdered(ctx, db, true); err != nil {
		return fmt.Errorf("outbox: making %s an ordered table: %w", b.t.full, err)
	}
	b.tm.set(OrderedByKey)
	return nil
}

func (b backendOps) convertToLog(context.Context, *sql.DB, bool, time.Duration) (Conversion, error) {
	return Conversion{}, b.errNotOnBackend("converting to the log layout")
}

// layout is Store.layout on a backend's table: LayoutRows when it exists.
func (b backendOps) layout(ctx context.Context, db *sql.DB) (Layout, error) {
	ok, err := b.be.Exists(ctx, db)
	switch {
	case err != nil:
		return 0, fmt.Errorf("outbox: reading the layout of %s: %w", b.t.full, err)
	case !ok:
		return 0, noTableError{b.t.full}
	}
	return LayoutRows, nil
}
