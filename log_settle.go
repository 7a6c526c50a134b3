package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/acemq/outbox/internal/pgsql"
	"github.com/acemq/outbox/internal/textcut"
)

// settle records what became of messages of a table of LayoutLog: kind
// 'p' (published) or 'r' (released) for messages taken in batches, and
// the matching update of the failed table for those taken from it. A batch
// that was taken over (a later gen exists) is left alone and its messages
// are reported as lost leases.
func (ls *logStore) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	type group struct {
		claim claimRef // a batchRef or a failedClaim
		ids   []string
		seqs  []int64
	}
	var (
		order  []claimRef
		groups = make(map[claimRef]*group)
		lost   []string
	)
	for _, m := range msgs {
		switch m.claim.(type) {
		case batchRef, failedClaim:
		default:
			// Claimed from the table before it was converted to the log
			// layout: the conversion copied it, to be claimed again.
			lost = append(lost, m.ID)
			continue
		}
		g := groups[m.claim]
		if g == nil {
			g = &group{claim: m.claim}
			if len(order) == 0 { // mostly the messages are all of one batch
				g.ids, g.seqs = make([]string, 0, len(msgs)), make([]int64, 0, len(msgs))
			}
			groups[m.claim] = g
			order = append(order, m.claim)
		}
		g.ids = append(g.ids, m.ID)
		g.seqs = append(g.seqs, m.Seq)
	}
	failedRefs := false
	for _, key := range order {
		g := groups[key]
		var (
			done map[string]bool
			err  error
		)
		switch c := g.claim.(type) {
		case failedClaim:
			failedRefs = true
			done, err = ls.settleFailed(ctx, db, kind, g.ids, string(c))
		case batchRef:
			done, err = ls.settleBatch(ctx, db, kind, c, g.ids, g.seqs)
		}
		if err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), ls.s.t.full, err)
		}
		for _, id := range g.ids {
			if !done[id] {
				lost = append(lost, id)
			}
		}
	}
	switch {
	case kind == 'r':
		ls.scanSoon()
		ls.failedSoon()
	case failedRefs:
		// On an ordered table the next messages of their keys may wait
		// in the failed table behind them (a key with a backlog).
		ls.failedSoon()
	}
	if len(lost) > 0 {
		return ls.s.leaseLost(ctx, what, lost)
	}
	return nil
}

// asyncCommit and asyncCondition make the bookkeeping of a log table's
// claims and settles commit asynchronously (see pgsql.AsyncCommit).
const (
	asyncCommit    = pgsql.AsyncCommit
	asyncCondition = pgsql.AsyncCondition
)

func (ls *logStore) settleBatch(ctx context.Context, db *sql.DB, kind byte, ref batchRef, ids []string, seqs []int64) (map[string]bool, error) {
	res, err := db.ExecContext(ctx, ls.settleSQL, ref.batch, ref.gen, string(kind), seqs, ref.token.String())
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	done := make(map[string]bool, len(ids))
	if n == 1 {
		for _, id := range ids {
			done[id] = true
		}
	}
	return done, nil
}

func (ls *logStore) settleFailed(ctx context.Context, db *sql.DB, kind byte, ids []string, token string) (map[string]bool, error) {
	set := `published_at = now(), claim_token = NULL, claimed_until = NULL`
	if kind == 'r' {
		set = `claim_token = NULL, claimed_until = NULL`
	}
	rows, err := db.QueryContext(ctx, `UPDATE `+ls.l.failed+` SET `+set+`
WHERE id = ANY($1::uuid[]) AND claim_token = $2::uuid AND published_at IS NULL RETURNING id`, ids, token)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		done[id] = true
	}
	return done, rows.Err()
}

// markFailed counts a failed attempt: a message of a batch is copied to the
// failed table (its batch records it as failed), one taken from the failed
// table has its row updated; both back off, and park at MaxAttempts.
func (ls *logStore) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	s := ls.s
	ref, isBatch := msg.claim.(batchRef)
	token, isFailed := msg.claim.(failedClaim)
	if !isBatch && !isFailed { // claimed before the table was converted to the log layout
		return s.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	reason = textcut.Cut(strings.ReplaceAll(reason, "\x00", ""), lastErrorMax)
	delay := s.backoff(msg.Attempts + 1)
	var (
		attempts int
		parked   bool
		err      error
	)
	if isFailed {
		err = db.QueryRowContext(ctx, ls.refailSQL, msg.ID, string(token), reason, delay.Microseconds(), s.maxAttempts).Scan(&attempts, &parked)
	} else {
		headers, herr := json.Marshal(msg.Headers)
		if herr != nil {
			return fmt.Errorf("outbox: marking message %s failed: %w", msg.ID, herr)
		}
		if msg.Headers == nil {
			headers = []byte("{}")
		}
		err = db.QueryRowContext(ctx, ls.failSQL,
			ref.batch, ref.gen, msg.Seq, msg.ID, msg.EventType, msg.Key, msg.Exchange, msg.RoutingKey, msg.Payload, msg.ContentType,
			string(headers), msg.CreatedAt, reason, delay.Microseconds(), s.maxAttempts, msg.ord, ref.token.String()).Scan(&attempts, &parked)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return s.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	if err != nil {
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, s.t.full, err)
	}
	ls.failedSoon()
	if parked {
		s.warnParked(ctx, msg.ID, attempts, reason)
	}
	return nil
}
