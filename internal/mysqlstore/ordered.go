package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"
)

// An ordered table keeps the order of each key: for two messages m1 and m2
// of one key, m1 written first (its writer took the key's turn first), the
// first delivery of m2 never comes before the first delivery of m1.
//
//   - Writers take turns: the order trigger upserts the key's row of the
//     keys table, which locks it until the writer's transaction ends (a
//     second writer of the key waits there), and gives the message its
//     place, ord, from the row's counter. A message's place is therefore
//     the order in which writers took the key, which is the order in
//     which they committed. Store.Add takes the keys of a call in sorted
//     order first, so that one call never deadlocks by itself.
//   - A claim takes a message of a key only with every unpublished message
//     of its key before it (claimable): any of those it could not lock or
//     that is not ready (claimed, backing off, parked, or uncommitted —
//     but an uncommitted one comes after every committed one, its writer
//     holding the turn) stops the key there.
//   - A message that fails holds the later messages of its key (held:
//     out of the claims' index range) until it is published, re-armed or
//     discarded; Reconcile mends what a failed hold or unhold left.

// rounds bounds how many times a claim reads on past candidates that a
// key's order held back, so that a backlog of keys in flight does not
// fill every claim with rows it cannot take.
const rounds = 8

// orderedCandidates returns, of cands (the first round) and the rounds
// after them, those a claim may take, in the order of seq: at most n.
func (s *Store) orderedCandidates(ctx context.Context, tx *sql.Tx, cands []candidate, n int) ([]candidate, error) {
	all := cands
	for round := 1; ; round++ {
		ok, err := s.claimable(ctx, tx, all)
		if err != nil || len(ok) >= n || len(cands) < n || round == rounds {
			return ok[:min(len(ok), n)], err
		}
		if cands, err = s.candidates(ctx, tx, s.q.orderedCandidates, n, all[len(all)-1].seq); err != nil {
			return nil, err
		}
		all = append(all, cands...)
	}
}

// claimable returns the candidates (in the order of seq, locked by this
// claim) a claim may take: those without a key, and those of a key whose
// unpublished messages before them are all candidates.
func (s *Store) claimable(ctx context.Context, tx *sql.Tx, cands []candidate) ([]candidate, error) {
	type place struct{ ord, seq int64 }
	last := map[string]place{} // the last candidate of each key
	mine := map[int64]bool{}
	var keys []string
	for _, c := range cands {
		if c.key == "" {
			continue
		}
		if _, ok := last[c.key]; !ok {
			keys = append(keys, c.key)
		}
		if p := last[c.key]; c.ord > p.ord || (c.ord == p.ord && c.seq > p.seq) {
			last[c.key] = place{c.ord, c.seq}
		}
		mine[c.seq] = true
	}
	if len(keys) == 0 {
		return cands, nil
	}
	// The unpublished messages of each key up to its last candidate, by
	// the key index, latest committed (READ COMMITTED).
	var bind []any
	for _, k := range keys {
		bind = append(bind, k, last[k].ord)
	}
	query := s.list("before", `SELECT event_key, ord, seq FROM {table} FORCE INDEX (key_idx) WHERE `+
		strings.TrimSuffix(strings.Repeat("(event_key = ? AND published_at IS NULL AND ord <= ?) OR ", len(keys)), " OR "), len(keys))
	rows, err := tx.QueryContext(ctx, query, bind...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	gap := map[string]place{} // each key's first unpublished message that is not a candidate
	for rows.Next() {
		var (
			k string
			p place
		)
		if err := rows.Scan(&k, &p.ord, &p.seq); err != nil {
			return nil, err
		}
		if mine[p.seq] {
			continue
		}
		if g, ok := gap[k]; !ok || p.ord < g.ord || (p.ord == g.ord && p.seq < g.seq) {
			gap[k] = p
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := cands[:0:0]
	for _, c := range cands {
		if g, ok := gap[c.key]; c.key != "" && ok && (g.ord < c.ord || (g.ord == c.ord && g.seq < c.seq)) {
			continue // behind a message of its key this claim does not hold
		}
		out = append(out, c)
	}
	return out, nil
}

// unhold brings back the held messages of keys, whose first message was
// published, re-armed or discarded. Like every change of this file it
// finds its rows first, without locking them, then changes them by their
// seqs: a statement that found them through an index locked its entries
// before their rows, where a mark locks rows first, then their entries,
// and the two deadlocked.
func (s *Store) unhold(ctx context.Context, db *sql.DB, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	rows, err := db.QueryContext(ctx, s.list("held-of", `SELECT seq FROM {table} FORCE INDEX (key_idx) WHERE event_key IN ({in}) AND {held}`, len(keys)), args(keys)...)
	if err != nil {
		return err
	}
	seqs, err := scanSeqs(rows)
	if err != nil {
		return err
	}
	_, err = s.bySeq(ctx, db, seqs, "unhold", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = FALSE WHERE seq IN ({in}) AND {held}`)
	return err
}

// hold holds the waiting messages of key after the one at (ord, seq).
func (s *Store) hold(ctx context.Context, db *sql.DB, key string, ord, seq int64) error {
	rows, err := db.QueryContext(ctx, s.q.holdOf, key, ord, ord, seq)
	if err != nil {
		return err
	}
	seqs, err := scanSeqs(rows)
	if err != nil {
		return err
	}
	_, err = s.bySeq(ctx, db, seqs, "hold", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = TRUE WHERE seq IN ({in}) AND {waiting}`)
	return err
}

// bySeq runs update (an UPDATE whose "{in}" takes seqs) at READ COMMITTED
// and returns how many rows it changed.
func (s *Store) bySeq(ctx context.Context, db *sql.DB, seqs []int64, kind, update string) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	slices.Sort(seqs)
	var n int64
	err := readCommitted(ctx, db, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.list(kind, update, len(seqs)), args(seqs)...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err == nil && n > 0 && strings.HasPrefix(kind, "unhold") {
		s.low.lower(seqs[0] - 1) // back among the waiting rows
	}
	return n, err
}

// Reconcile implements backend.Backend. It reads the rows to change
// without locking them, then changes them by their seqs (ascending, as
// every mark locks rows) with the conditions checked again, at READ
// COMMITTED: a statement that scanned the table and locked what it read
// deadlocked with the relays' marks.
func (s *Store) Reconcile(ctx context.Context, db *sql.DB, ordered bool) (held, unheld int64, err error) {
	if !ordered {
		unheld, err = s.change(ctx, db, s.q.unholdAllFind, "unhold", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = FALSE WHERE seq IN ({in}) AND {held}`)
		return 0, unheld, err
	}
	if held, err = s.change(ctx, db, s.q.holdFind, "hold-all", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = TRUE WHERE seq IN ({in}) AND {waiting}`); err != nil {
		return 0, 0, err
	}
	unheld, err = s.change(ctx, db, s.q.unholdFind, "unhold", `UPDATE {table} FORCE INDEX (PRIMARY) SET held = FALSE WHERE seq IN ({in}) AND {held}`)
	return held, unheld, err
}

// reconcileMax bounds the rows one statement of Reconcile changes; the
// next round (a second later) takes the rest.
const reconcileMax = 1000

// change runs find, which lists seqs, and update on them (see bySeq).
func (s *Store) change(ctx context.Context, db *sql.DB, find, kind, update string) (int64, error) {
	rows, err := db.QueryContext(ctx, find, reconcileMax)
	if err != nil {
		return 0, err
	}
	seqs, err := scanSeqs(rows)
	if err != nil {
		return 0, err
	}
	return s.bySeq(ctx, db, seqs, kind, update)
}

// Ordered implements backend.Backend: the table has its order trigger.
func (s *Store) Ordered(ctx context.Context, db *sql.DB) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.triggers
WHERE trigger_schema = coalesce(nullif(?, ''), DATABASE()) AND trigger_name = ? AND event_object_table = ?`,
		s.schema, s.name+"_order", s.name).Scan(&n)
	return n > 0, err
}

// SetOrdered implements backend.Backend: the trigger created when it is
// not there, dropped when it is.
func (s *Store) SetOrdered(ctx context.Context, db *sql.DB, ordered bool) error {
	is, err := s.Ordered(ctx, db)
	if err != nil || is == ordered {
		return err
	}
	stmts := s.UnorderStatements()
	if ordered {
		stmts = s.OrderStatements()
	}
	for _, st := range stmts {
		if _, err := db.ExecContext(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// KeyTurnSQL implements backend.Backend: the keys' rows upserted, in the
// order bound, each locked until the writer's transaction ends.
func (s *Store) KeyTurnSQL(n int) string {
	return s.list("turns", `INSERT INTO {keys} (event_key) VALUES {rows} ON DUPLICATE KEY UPDATE event_key = event_key`, n)
}

// Maintain implements backend.Backend: the look below the claims'
// low-water mark (low.go), beside the claims, when due: the first ready
// row below it, if any, is where the next claim reads from. It reads
// without locking, and takes as long as the delete-marked entries it
// steps over (1.5 s for 300,000 while a snapshot was held), which is why
// no claim waits for it.
func (s *Store) Maintain(ctx context.Context, db *sql.DB) error {
	s.low.maintainAt.Store(time.Now().UnixNano())
	if !s.low.due() {
		return nil
	}
	start := time.Now()
	var seq sql.NullInt64
	err := db.QueryRowContext(ctx, s.q.look, s.low.seq.Load()).Scan(&seq)
	s.low.read(0, time.Since(start))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	if seq.Valid {
		s.low.lower(seq.Int64 - 1)
	}
	return nil
}
