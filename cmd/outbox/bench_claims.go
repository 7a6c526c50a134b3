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
		var empty, full []time.Duration
		for _, history := range []int{0, b.o.published} {
			if err := b.fill(ctx, history, keys); err != nil {
				return err
			}
			took, err := b.measure(ctx, store)
			if err != nil {
				return err
			}
			if history == 0 {
				empty = took
			} else {
				full = took
			}
		}
		p50e, p50f := percentile(empty, 0.5), percentile(full, 0.5)
		fmt.Fprintf(out, "bench: %s: no history %.2f ms [%.2f]; %d published rows %.2f ms [%.2f]; ratio %.2f\n",
			store.Ordering(), ms(p50e), ms(percentile(empty, 0.9)), b.o.published, ms(p50f), ms(percentile(full, 0.9)), float64(p50f)/float64(p50e))
	}
	return nil
}

// fill empties the table, writes history published rows and the waiting
// messages, the keys in turn, and vacuums, as autovacuum would have.
func (b *claimBench) fill(ctx context.Context, history, keys int) error {
	fmt.Fprintf(b.stderr, "bench: writing %d published and %d waiting rows\n", history, b.o.pending)
	payload := make([]byte, b.o.size)
	stmts := []struct {
		q    string
		args []any
	}{
		{`TRUNCATE "` + b.table + `"`, nil},
		{`INSERT INTO "` + b.table + `" (id, event_type, event_key, payload, published_at)
SELECT gen_random_uuid(), 'bench.tick', 'k' || (i % $2), $3, now() - interval '1 hour' FROM generate_series(1, $1) AS i`, []any{history, keys, payload}},
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
		start := time.Now()
		msgs, err := store.Claim(ctx, b.o.batch, time.Minute)
		if err != nil {
			return nil, err
		}
		took = append(took, time.Since(start))
		if len(msgs) == 0 {
			return nil, fmt.Errorf("the table ran dry: raise --pending")
		}
		if err := store.MarkPublished(ctx, msgs...); err != nil {
			return nil, err
		}
	}
	slices.Sort(took)
	return took, nil
}
