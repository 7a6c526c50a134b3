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
// published, as a relay would) one measurement makes on each table.
const claimsMeasured = 200

// claimBench measures what a claim costs as the table grows: the same
// waiting messages over the same keys on two tables, one without published
// history and one with --published rows of it, claimed in turn so that
// whatever else the machine does weighs on both alike; in each mode.
type claimBench struct {
	o      benchOptions
	db     *sql.DB
	tables [2]string                 // without, with history
	stores map[bool][2]*outbox.Store // by ordered, on the tables
	stderr io.Writer
}

// claims runs the claims bench on two scratch tables named after the
// command's, and drops the second (the caller drops the first).
func claims(ctx context.Context, c *common, o benchOptions, db *sql.DB) error {
	b := &claimBench{o: o, db: db, tables: [2]string{c.table, c.table + "_history"}, stores: map[bool][2]*outbox.Store{}, stderr: c.stderr}
	defer db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS "`+b.tables[1]+`"`) //nolint:errcheck
	for _, ordered := range []bool{false, true} {
		var pair [2]*outbox.Store
		for i, table := range b.tables {
			s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Ordering: ordering(ordered)})
			if err != nil {
				return err
			}
			if err := s.CreateRowsSchemaIfAbsent(ctx); err != nil {
				return err
			}
			pair[i] = s
		}
		b.stores[ordered] = pair
	}
	return b.run(ctx, c.stdout)
}

func (b *claimBench) run(ctx context.Context, out io.Writer) error {
	keys := b.o.keys
	if keys == 0 {
		keys = 10_000
	}
	fmt.Fprintf(out, "bench: claims of %d, each marked published after, %d claims per figure, the two tables in turn; %d messages waiting over %d keys; p50 [p90] of claim time\n",
		b.o.batch, claimsMeasured, b.o.pending, keys)
	for _, ordered := range []bool{false, true} {
		pair := b.stores[ordered]
		for i, history := range []int{0, b.o.published} {
			// The order is the table's: make it this mode's.
			if _, err := pair[i].ConvertOrdering(ctx, ordering(ordered), false, 5*time.Second); err != nil {
				return err
			}
			if err := b.fill(ctx, b.tables[i], history, keys, 0); err != nil {
				return err
			}
		}
		var took [2][]time.Duration
		for n := range claimsMeasured {
			for k := range 2 {
				i := (n + k) % 2 // each table goes first half the time
				d, err := b.claimOnce(ctx, pair[i])
				if err != nil {
					return err
				}
				took[i] = append(took[i], d)
			}
		}
		empty, full := slices.Sorted(slices.Values(took[0])), slices.Sorted(slices.Values(took[1]))
		p50e, p50f := percentile(empty, 0.5), percentile(full, 0.5)
		fmt.Fprintf(out, "bench: %s: no history %.2f ms [%.2f]; %d published rows %.2f ms [%.2f]; ratio %.2f\n",
			pair[0].Ordering(), ms(p50e), ms(percentile(empty, 0.9)), b.o.published, ms(p50f), ms(percentile(full, 0.9)), float64(p50f)/float64(p50e))
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
	store := b.stores[true][0]
	if err := b.fill(ctx, b.tables[0], 0, keys, b.o.blocked); err != nil {
		return err
	}
	measure := func(n int) ([]time.Duration, error) {
		took := make([]time.Duration, 0, n)
		for range n {
			d, err := b.claimOnce(ctx, store)
			if err != nil {
				return nil, err
			}
			took = append(took, d)
		}
		slices.Sort(took)
		return took, nil
	}
	before, err := measure(blockedKeyClaims)
	if err != nil {
		return err
	}
	start := time.Now()
	held, _, err := store.Reconcile(ctx)
	if err != nil {
		return err
	}
	reconciled := time.Since(start)
	// The first claims after the hold clean the claim index of the held
	// rows' old entries; a VACUUM would too.
	after, err := measure(claimsMeasured)
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
func (b *claimBench) fill(ctx context.Context, table string, history, keys, blocked int) error {
	fmt.Fprintf(b.stderr, "bench: writing %d published, %d blocked and %d waiting rows into %s\n", history, blocked, b.o.pending, table)
	payload := make([]byte, b.o.size)
	stmts := []struct {
		q    string
		args []any
	}{
		{`TRUNCATE "` + table + `"`, nil},
		{`INSERT INTO "` + table + `" (id, event_type, event_key, payload, published_at)
SELECT gen_random_uuid(), 'bench.tick', 'k' || (i % $2), $3, now() - interval '1 hour' FROM generate_series(1, $1) AS i`, []any{history, keys, payload}},
		{`INSERT INTO "` + table + `" (id, event_type, event_key, payload, parked_at, attempts)
SELECT gen_random_uuid(), 'bench.tick', 'blocked', $2::bytea, now(), 10 WHERE $1::int > 0
UNION ALL
SELECT * FROM (SELECT gen_random_uuid(), 'bench.tick', 'blocked', $2::bytea, NULL::timestamptz, 0 FROM generate_series(1, $1::int) AS i ORDER BY i) AS behind`, []any{blocked, payload}},
		{`INSERT INTO "` + table + `" (id, event_type, event_key, payload)
SELECT gen_random_uuid(), 'bench.tick', 'k' || (i % $2), $3 FROM generate_series(1, $1) AS i ORDER BY i`, []any{b.o.pending, keys, payload}},
		{`VACUUM ANALYZE "` + table + `"`, nil},
	}
	for _, s := range stmts {
		if _, err := b.db.ExecContext(ctx, s.q, s.args...); err != nil {
			return err
		}
	}
	return nil
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
