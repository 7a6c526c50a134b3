package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
)

// candidate is a row the claim's locking read returned.
type candidate struct {
	seq, ord, size int64
	key            string
}

// Claim is the claim token a claim wrote in the rows it took.
type Claim string

// Backend implements backend.Claim.
func (Claim) Backend() string { return "mysql" }

// Claim implements backend.Queue.
func (s *Store) Claim(ctx context.Context, db *sql.DB, n int, lease time.Duration, maxBytes int64, ordered bool) ([]backend.Row, backend.Claim, error) {
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, nil, fmt.Errorf("generating claim token: %w", err)
	}
	c := Claim(token.String())
	if !ordered {
		var claimed []backend.Row
		err = readCommitted(ctx, db, func(tx *sql.Tx) error {
			claimed, err = s.lockRows(ctx, tx, n, lease, maxBytes, c)
			return err
		})
		return claimed, c, err
	}
	var seqs []int64
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		seqs, err = s.lockOrdered(ctx, tx, n, lease, maxBytes, string(c))
		return err
	})
	if err != nil || len(seqs) == 0 {
		return nil, c, err
	}
	rows, err := db.QueryContext(ctx, s.list("claimed", `SELECT {columns} FROM {table} FORCE INDEX (PRIMARY) WHERE claim_token = ? AND seq IN ({in}) ORDER BY seq`, len(seqs)),
		args(seqs, string(c))...)
	if err != nil {
		return nil, c, fmt.Errorf("reading the claimed messages: %w", err)
	}
	claimed, err := scanRows(rows)
	for i := range claimed {
		claimed[i].Claim = c
	}
	inKeyOrder(claimed)
	return claimed, c, err
}

// lockRows is an unordered claim's transaction: the ready rows locked and
// read whole, in the order of seq, those within the byte window kept (the
// others are read on, not kept, so that memory holds the window and no
// more) and leased.
func (s *Store) lockRows(ctx context.Context, tx *sql.Tx, n int, lease time.Duration, maxBytes int64, token Claim) ([]backend.Row, error) {
	from, start := s.low.from(), time.Now()
	rows, err := tx.QueryContext(ctx, s.q.candidates, lease.Microseconds(), from, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	defer func() { s.low.read(from, time.Since(start)) }()
	var (
		kept   []backend.Row
		before int64
	)
	for rows.Next() {
		var (
			r                                 backend.Row
			created, claimed, parked, size, u int64
			was                               string // the claim token the row carried
		)
		if len(kept) > 0 && before >= maxBytes {
			continue // read on, keeping nothing
		}
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.Key, &r.Exchange, &r.RoutingKey, &r.Payload, &r.ContentType, &r.Headers,
			&created, &r.Attempts, &r.LastError, &was, &claimed, &parked, &r.Ord, &size, &u); err != nil {
			return nil, err
		}
		r.CreatedAt, r.ParkedAt, r.ClaimedUntil, r.Claim = fromMicros(created), fromMicros(parked), fromMicros(u), token
		kept = append(kept, r)
		before += size
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(kept) == 0 {
		s.low.found(from, 0)
		return nil, nil
	}
	s.low.found(from, kept[len(kept)-1].Seq)
	seqs := make([]int64, len(kept))
	for i, r := range kept {
		seqs[i] = r.Seq
	}
	_, err = tx.ExecContext(ctx, s.list("lease", `UPDATE {table} FORCE INDEX (PRIMARY) SET claimed_until = {now} + INTERVAL ? MICROSECOND, claim_token = ? WHERE seq IN ({in})`, len(seqs)),
		args(seqs, lease.Microseconds(), string(token))...)
	return kept, err
}

// lockOrdered is an ordered claim's transaction: the candidates locked,
// those a claim may take (see claimable) within the byte window leased.
func (s *Store) lockOrdered(ctx context.Context, tx *sql.Tx, n int, lease time.Duration, maxBytes int64, token string) ([]int64, error) {
	from, start := s.low.from(), time.Now()
	cands, err := s.candidates(ctx, tx, s.q.orderedCandidates, n, from)
	if err != nil {
		return nil, err
	}
	s.low.read(from, time.Since(start))
	// The rows before the first candidate are not ready; the candidates
	// the order holds back may be ready for the next claim.
	if len(cands) == 0 {
		s.low.found(from, 0)
	} else {
		s.low.found(from, cands[0].seq-1)
	}
	if cands, err = s.orderedCandidates(ctx, tx, cands, n); err != nil {
		return nil, err
	}
	var (
		seqs   []int64
		before int64
	)
	for _, c := range cands { // in the order of seq
		if len(seqs) > 0 && before >= maxBytes {
			break
		}
		seqs = append(seqs, c.seq)
		before += c.size
	}
	if len(seqs) == 0 {
		return nil, nil
	}
	_, err = tx.ExecContext(ctx, s.list("lease", `UPDATE {table} FORCE INDEX (PRIMARY) SET claimed_until = {now} + INTERVAL ? MICROSECOND, claim_token = ? WHERE seq IN ({in})`, len(seqs)),
		args(seqs, lease.Microseconds(), token)...)
	return seqs, err
}

// candidates runs the locking read query for up to n rows after seq from.
func (s *Store) candidates(ctx context.Context, tx *sql.Tx, query string, n int, from int64) ([]candidate, error) {
	rows, err := tx.QueryContext(ctx, query, from, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cands []candidate
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.seq, &c.key, &c.ord, &c.size); err != nil {
			return nil, err
		}
		cands = append(cands, c)
	}
	return cands, rows.Err()
}

// Settle implements backend.Backend. A message published keeps the token
// of the claim that published it, so that a mark repeated after a reply
// that was lost (the first one committed) finds it its own.
func (s *Store) Settle(ctx context.Context, db *sql.DB, published bool, bc backend.Claim, refs []backend.Ref, ordered bool) ([]int, error) {
	c, ok := bc.(Claim)
	if len(refs) == 0 || !ok {
		return nil, nil // no claim of this backend's: every lease lost
	}
	done, err := s.settle(ctx, db, published, string(c), refs, ordered)
	return indexesOf(refs, done), err
}

// indexesOf returns the indexes in refs of the messages of seqs.
func indexesOf(refs []backend.Ref, seqs []int64) []int {
	at := make(map[int64]int, len(refs))
	for i, r := range refs {
		at[r.Seq] = i
	}
	idx := make([]int, 0, len(seqs))
	for _, q := range seqs {
		if i, ok := at[q]; ok {
			idx = append(idx, i)
		}
	}
	return idx
}

// settle is Settle by seq: it returns the seqs of the messages marked.
func (s *Store) settle(ctx context.Context, db *sql.DB, published bool, claim string, refs []backend.Ref, ordered bool) ([]int64, error) {
	seqs := make([]int64, len(refs))
	for i, r := range refs {
		seqs[i] = r.Seq
	}
	if !published {
		return s.release(ctx, db, claim, seqs)
	}
	res, err := db.ExecContext(ctx, s.list("publish", `UPDATE {table} FORCE INDEX (PRIMARY) SET published_at = {now}, claimed_until = NULL
WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NULL`, len(seqs)), args(seqs, claim)...)
	if err != nil {
		return nil, err
	}
	done := seqs
	if n, err := res.RowsAffected(); err != nil || n != int64(len(seqs)) {
		// Fewer than given: those still carrying the token are the claim's.
		rows, err := db.QueryContext(ctx, s.list("published", `SELECT seq FROM {table} FORCE INDEX (PRIMARY) WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NOT NULL`, len(seqs)),
			args(seqs, claim)...)
		if err != nil {
			return nil, err
		}
		if done, err = scanSeqs(rows); err != nil {
			return nil, err
		}
	}
	if !ordered {
		return done, nil
	}
	return done, s.unhold(ctx, db, keysOf(refs))
}

// release gives back the rows of seqs the claim holds: the token is
// cleared, so the rows are read, locked, first.
func (s *Store) release(ctx context.Context, db *sql.DB, claim string, seqs []int64) (done []int64, err error) {
	err = readCommitted(ctx, db, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.list("held", `SELECT seq FROM {table} FORCE INDEX (PRIMARY) WHERE claim_token = ? AND seq IN ({in}) AND published_at IS NULL FOR UPDATE`, len(seqs)),
			args(seqs, claim)...)
		if err != nil {
			return err
		}
		if done, err = scanSeqs(rows); err != nil || len(done) == 0 {
			return err
		}
		_, err = tx.ExecContext(ctx, s.list("release", `UPDATE {table} FORCE INDEX (PRIMARY) SET claimed_until = NULL, claim_token = NULL WHERE claim_token = ? AND seq IN ({in})`, len(done)),
			args(done, claim)...)
		return err
	})
	if err == nil && len(done) > 0 {
		s.low.lower(slices.Min(done) - 1) // ready again now
	}
	return done, err
}

// Fail implements backend.Queue.
func (s *Store) Fail(ctx context.Context, db *sql.DB, ref backend.Ref, bc backend.Claim, reason string, delay time.Duration, maxAttempts int, ordered bool) (backend.Failure, bool, error) {
	c, ok := bc.(Claim)
	if !ok {
		return backend.Failure{}, false, nil
	}
	res, err := db.ExecContext(ctx, s.q.fail, maxAttempts, reason, delay.Microseconds(), ref.Seq, string(c))
	if err != nil {
		return backend.Failure{}, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return backend.Failure{}, false, err
	}
	s.low.lower(ref.Seq - 1) // due again after its backoff
	var (
		f   backend.Failure
		ord int64
	)
	if err := db.QueryRowContext(ctx, s.q.failed, ref.Seq).Scan(&f.Attempts, &f.Parked, &ord); err != nil {
		return f, true, err
	}
	if ordered && ref.Key != "" {
		err = s.hold(ctx, db, ref.Key, ord, ref.Seq)
	}
	return f, true, err
}

func keysOf(refs []backend.Ref) []string {
	var keys []string
	for _, r := range refs {
		if r.Key != "" {
			keys = append(keys, r.Key)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// inKeyOrder puts the rows of each key in their key's order (ord, then
// seq), each key keeping the places its rows have in the order of seq:
// seq is drawn when an INSERT begins, before its writer may have waited
// for the key's turn, so two writers of a key can draw their seqs in the
// other order than they took the turn.
func inKeyOrder(rows []backend.Row) {
	byKey := map[string][]int{}
	for i, r := range rows {
		if r.Key != "" {
			byKey[r.Key] = append(byKey[r.Key], i)
		}
	}
	for _, places := range byKey {
		if len(places) < 2 {
			continue
		}
		keyRows := make([]backend.Row, len(places))
		for j, i := range places {
			keyRows[j] = rows[i]
		}
		slices.SortStableFunc(keyRows, func(a, b backend.Row) int {
			return cmp.Or(cmp.Compare(a.Ord, b.Ord), cmp.Compare(a.Seq, b.Seq))
		})
		for j, i := range places {
			rows[i] = keyRows[j]
		}
	}
}
