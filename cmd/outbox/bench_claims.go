package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/acemq/outbox"
)

// claimsMeasured is how many claims of --batch-size (each then marked
// published, as a relay would) one measurement makes.
const claimsMeasured = 200

// claimBench measures what a claim costs as the table grows: the same
// waiting messages over the same keys, on a table without published
// history and on one with --published rows of it, in each mode.
type claimBench struct {
	o      benchOptions
	db     *sql.DB
	table  string
	stores []*outbox.Store // unordered, ordered
	stderr io.Writer
}

func (b *claimBench) run(ctx context.Context, out io.Writer) error {
	keys := b.o.keys
	if keys == 0 {
		keys = 10_000
	}
	fmt.Fprintf(out, "bench: claims of %d, each marked published after, %d claims per figure; %d messages waiting over %d keys; p50 [p90] of claim time\n",
		b.o.batch, claimsMeasured, b.o.pending, keys)
	for _, store := range b.stores {
		var took [2][]time.Duration // without, with history
		for i, history := range []int{0, b.o.published} {
			if err := b.fill(ctx, history, keys, 0); err != nil {
				return err
			}
			var err error
			if took[i], err = b.measure(ctx, store); err != nil {
				return err
			}
		}
		empty, full := took[0], took[1]
		p50e, p50f := percentile(empty, 0.5), percentile(full, 0.5)
		fmt.Fprintf(out, "bench: %s: no history %.2f ms [%.2f]; %d published rows %.2f ms [%.2f]; ratio %.2f\n",
			store.Ordering(), ms(p50e), ms(percentile(empty, 0.9)), b.o.published, ms(p50f), ms(percentile(full, 0.9)), float64(p50f)/float64(p50e))
	}
	if b.o.blocked > 0 {
		return b.blockedKey(ctx, out, keys)
	}
	return nil
}

// blockedKeyClaims is how many claims measure a blocked key's messages
// before they are set aside: each walks over all of them.
const blockedKeyClaims = 10

// blockedKey measures ordered claims with one key blocked by a parked
// message and --blocked messages of it written after (not yet held), then
// after Store.Reconcile has set them aside.
func (b *claimBench) blockedKey(ctx context.Context, out io.Writer, keys int) error {
	store := b.stores[1]
	if err := b.fill(ctx, 0, keys, b.o.blocked); err != nil {
		return err
	}
	before := make([]time.Duration, 0, blockedKeyClaims)
	for range blockedKeyClaims {
		took, err := b.claimOnce(ctx, store)
		if err != nil {
			return err
		}
		before = append(before, took)
	}
	slices.Sort(before)
	start := time.Now()
	held, _, err := store.Reconcile(ctx)
	if err != nil {
		return err
	}
	reconciled := time.Since(start)
	// The first claims after the hold clean the claim index of the held
	// rows' old entries; a VACUUM would too.
	after, err := b.measure(ctx, store)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bench: ordered by key, one key blocked with %d messages behind it: claims %.2f ms [%.2f] before they are set aside; Reconcile set %d aside in %.0f ms; then %.2f ms [%.2f]\n",
		b.o.blocked, ms(percentile(before, 0.5)), ms(percentile(before, 0.9)), held, ms(reconciled), ms(percentile(after, 0.5)), ms(percentile(after, 0.9)))
	return nil
}

// fill empties the table, writes history published rows, then a parked
// message of the key "blocked" and blocked messages of that key behind it
// (when blocked > 0: claims meet them first), then the waiting messages,
// the keys in turn, and vacuums, as autovacuum would have.
func (b *claimBench) fill(ctx context.Context, history, keys, blocked int) error {
	fmt.Fprintf(b.stderr, "bench: writing %d published, %d blocked and %d waiting rows\n", history, blocked, b.o.pending)
	payload := make([]byte, b.o.size)
	stmts := []struct {
		q    string
		args []any
	}{
		{`TRUNCATE "` + b.table + `"`, nil},
		{`INSERT INTO "` + b.table + `" (id, event_type, event_key, payload, published_at)
SELECT gen_random_uuid(), 'bench.tick', 'k' || (i % $2), $3, now() - interval '1 hour' FROM generate_series(1, $1) AS i`, []any{history, keys, payload}},
		{`INSERT INTO "` + b.table + `" (id, event_type, event_key, payload, parked_at, attempts)
SELECT gen_random_uuid(), 'bench.tick', 'blocked', $2::bytea, now(), 10 WHERE $1::int > 0
UNION ALL
SELECT * FROM (SELECT gen_random_uuid(), 'bench.tick', 'blocked', $2::bytea, NULL::timestamptz, 0 FROM generate_series(1, $1::int) AS i ORDER BY i) AS behind`, []any{blocked, payload}},
		{`INSERT INTO "` + b.table + `" (id, event_type, event_key, payload)
SELECT gen_random_uuid(), 'bench.tick', 'k' || (i % $2), $3 FROM generate_series(1, $1) AS i ORDER BY i`, []any{b.o.pending, keys, payload}},
		{`VACUUM ANALYZE "` + b.table + `"`, nil},
	}
	for _, s := range stmts {
		if _, err := b.db.ExecContext(ctx, s.q, s.args...); err != nil {
			return err
		}
	}
	return nil
}

// measure claims and marks published claimsMeasured times and returns the
// claim times, sorted.
func (b *claimBench) measure(ctx context.Context, store *outbox.Store) ([]time.Duration, error) {
	took := make([]time.Duration, 0, claimsMeasured)
	for range claimsMeasured {
		d, err := b.claimOnce(ctx, store)
		if err != nil {
			return nil, err
		}
		took = append(took, d)
	}
	slices.Sort(took)
	return took, nil
}

// claimOnce claims a batch, marks it published and returns how long the
// claim took.
func (b *claimBench) claimOnce(ctx context.Context, store *outbox.Store) (time.Duration, error) {
	start := time.Now()
	msgs, err := store.Claim(ctx, b.o.batch, time.Minute)
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	if len(msgs) == 0 {
		return 0, fmt.Errorf("the table ran dry: raise --pending")
	}
	return took, store.MarkPublished(ctx, msgs...)
}
