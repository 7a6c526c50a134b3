package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox"
)

func cmdRetry(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("retry", x)
	c.positional = "ID..."
	all := c.fs.Bool("all-parked", false, "re-arm every parked message")
	dryRun := c.fs.Bool("dry-run", false, "with --all-parked: say how many messages would be re-armed, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	ids := c.args
	if *all == (len(ids) > 0) {
		return c.usageError("give message ids or --all-parked (not both)")
	}
	if err := c.messageIDs(ids); err != nil {
		return err
	}
	if *dryRun && !*all {
		return c.usageError("--dry-run goes with --all-parked")
	}
	var total int64
	err := c.eachTable(ctx, nil, func(store *outbox.Store) error {
		var n int64
		if *all {
			st, err := store.Stats(ctx)
			if err != nil {
				return c.explain(err)
			}
			if *dryRun {
				fmt.Fprintf(c.stdout, "would re-arm all %d parked message(s) of table %s\ndry run: nothing re-armed\n", st.Parked, c.table)
				return nil
			}
			fmt.Fprintf(c.stderr, "re-arming all %d parked message(s) of table %s\n", st.Parked, c.table)
			if n, err = store.RetryAllParked(ctx); err != nil {
				return c.explain(err)
			}
		} else {
			var err error
			if n, err = store.Retry(ctx, ids...); err != nil {
				return c.explain(err)
			}
		}
		total += n
		if n > 0 || !c.several() {
			fmt.Fprintf(c.stdout, "re-armed %d parked message(s) of table %s\n", n, c.table)
		}
		return nil
	})
	if !*all {
		c.notParked(total, ids)
	}
	return err
}

// discardDryRunLimit bounds the parked messages a dry run of discard reads.
const discardDryRunLimit = 100_000

func cmdDiscard(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("discard", x)
	c.positional = "ID..."
	dryRun := c.fs.Bool("dry-run", false, "say which of the ids are parked messages that would be discarded, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	ids := c.args
	if len(ids) == 0 {
		return c.usageError("give the ids of the parked messages to discard (outbox parked lists them)")
	}
	if err := c.messageIDs(ids); err != nil {
		return err
	}
	var total int64
	err := c.eachTable(ctx, nil, func(store *outbox.Store) error {
		if *dryRun {
			parked, err := store.Parked(ctx, discardDryRunLimit)
			if err != nil {
				return c.explain(err)
			}
			found := idsAmong(parked, ids)
			if len(found) > 0 || !c.several() {
				fmt.Fprintf(c.stdout, "would discard %d of the %d id(s) given, the parked messages of table %s: %s\n",
					len(found), len(ids), c.table, strings.Join(found, " "))
			}
			return nil
		}
		if !c.several() {
			fmt.Fprintf(c.stderr, "discarding %d message(s) of table %s, those of them that are parked\n", len(ids), c.table)
		}
		n, err := store.Discard(ctx, ids...)
		if err != nil {
			return c.explain(err)
		}
		total += n
		if n > 0 || !c.several() {
			fmt.Fprintf(c.stdout, "discarded %d parked message(s) of table %s: they will not be published; their rows stay, with discarded_at set, until purged\n", n, c.table)
		}
		return nil
	})
	if *dryRun {
		if err == nil || c.several() {
			fmt.Fprintln(c.stdout, "dry run: nothing discarded")
		}
		return err
	}
	c.notParked(total, ids)
	return err
}

// idsAmong returns the ids of msgs that are among ids (in any case).
func idsAmong(msgs []outbox.Message, ids []string) []string {
	want := map[string]bool{}
	for _, id := range ids {
		want[strings.ToLower(id)] = true
	}
	var found []string
	for _, m := range msgs {
		if want[strings.ToLower(m.ID)] {
			found = append(found, m.ID)
		}
	}
	return found
}

// messageIDs refuses, before anything is said or done, an argument that
// is not a message id: a message's id is a UUID.
func (c *common) messageIDs(ids []string) error {
	for i, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			return c.usageError("argument %d, %q, is not a message id (a UUID such as 0195f1d2-7a7e-7c1f-9a40-3f1b2c3d4e5f): outbox parked lists the parked messages' ids", i+1, printable(id, 60))
		}
	}
	return nil
}

// notParked says how many of ids a retry or discard left alone, having
// changed n.
func (c *common) notParked(n int64, ids []string) {
	switch {
	case int(n) >= len(ids):
	case c.several():
		fmt.Fprintf(c.stdout, "%d id(s) were not parked messages of these tables and were left alone\n", len(ids)-int(n))
	default:
		fmt.Fprintf(c.stdout, "%d id(s) were not parked messages of %s and were left alone\n", len(ids)-int(n), c.table)
	}
}

func cmdPurge(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("purge", x)
	olderThan := c.fs.Duration("older-than", 0, "delete published messages older than this (e.g. 168h); required")
	batch := c.fs.Int("batch-size", outbox.PurgeBatchSizeDefault, "rows deleted per statement")
	dryRun := c.fs.Bool("dry-run", false, "say how many messages would be deleted, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if *olderThan <= 0 {
		return c.usageError("--older-than is required and must be positive, e.g. --older-than 168h")
	}
	if err := c.positive(map[string]int64{"batch-size": int64(*batch)}); err != nil {
		return err
	}
	return c.eachTable(ctx, &outbox.StoreConfig{PurgeBatchSize: *batch}, func(store *outbox.Store) error {
		return c.purge(ctx, store, *olderThan, *dryRun)
	})
}

// purge purges c.table (store's) of the published messages older than
// olderThan.
func (c *common) purge(ctx context.Context, store *outbox.Store, olderThan time.Duration, dryRun bool) error {
	due, err := store.Purgeable(ctx, olderThan)
	if err != nil {
		return c.explain(err)
	}
	if dryRun {
		fmt.Fprintf(c.stdout, "would purge %d published message(s) older than %s from table %s\ndry run: nothing deleted\n", due, olderThan, c.table)
		return nil
	}
	fmt.Fprintf(c.stderr, "purging %d published message(s) older than %s from table %s\n", due, olderThan, c.table)
	started := time.Now()
	last := started
	n, err := store.PurgePublishedProgress(ctx, olderThan, func(total int64) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(c.stderr, "purged %d so far (%.0f rows/s)\n", total, float64(total)/time.Since(started).Seconds())
		}
	})
	if err != nil {
		return fmt.Errorf("after purging %d: %w", n, c.explain(err))
	}
	fmt.Fprintf(c.stdout, "purged %d published message(s) older than %s from table %s in %s\n", n, olderThan, c.table, time.Since(started).Round(time.Millisecond))
	if n < due {
		return c.whyNotPurged(ctx, store, olderThan, due-n)
	}
	return nil
}

// whyNotPurged says why a purge removed fewer messages than it counted
// before it began (missing of them).
func (c *common) whyNotPurged(ctx context.Context, store *outbox.Store, olderThan time.Duration, missing int64) error {
	left, err := store.Purgeable(ctx, olderThan)
	if err != nil {
		return c.explain(err)
	}
	layout, err := store.Layout(ctx)
	if err != nil {
		return c.explain(err)
	}
	switch {
	case left > 0 && layout == outbox.LayoutLog:
		fmt.Fprintf(c.stdout, "%d message(s) counted before were not purged: their partitions were in use. The log layout drops a partition whole, and waits at most 50ms for its lock so that relays and writers never wait behind a purge; a transaction that has read the table and is still open (a long report, a session idle in transaction: see pg_stat_activity) holds it. Run the purge again once it has ended.\n", left)
	case left > 0:
		fmt.Fprintf(c.stdout, "%d message(s) are purgeable now that were not when the purge began (published meanwhile, or older than the cutoff by now): run it again to remove them\n", left)
	default:
		fmt.Fprintf(c.stdout, "%d message(s) counted before were removed meanwhile by another purge (another outbox purge, or a relay with --purge-after), or were never there: the log layout's count is the planner's estimate of its partitions' rows\n", missing)
	}
	return nil
}

func cmdSchema(ctx context.Context, x *cli, args []string) error {
	c := newCommon("schema", x, outbox.TableDefault)
	apply := c.fs.Bool("apply", false, "create the table in the database instead of printing the DDL")
	notify := c.fs.Bool("notify", false, "include the LISTEN/NOTIFY trigger that wakes relays at once (costs write throughput; see README)")
	layout := c.fs.String("layout", "", "log: events only ever inserted, relaying leaves no dead tuples, history truncated by partition (the default); rows: one row per message, updated as it is claimed and published (see README). With --apply on a table that exists, the default is its layout")
	orderedTable := c.fs.Bool("ordered", false, "make it an ordered table: every writer of a key takes its turn, relays publish each key's messages in commit order (see README)")
	if err := c.parse(args); err != nil {
		return err
	}
	if c.onMySQL() {
		return c.mysqlSchema(ctx, *apply, *layout, *orderedTable, *notify)
	}
	var (
		ddl  string
		err  error
		want outbox.Layout
	)
	checked := false
	if *layout == "" {
		*layout = "log"
		if *apply { // bring a table that exists up to date in its own layout
			have, exists, err := c.existingLayout(ctx)
			if err != nil && !(exists && have == outbox.LayoutLog) {
				return err
			}
			if exists {
				*layout, checked = have.String(), true
			}
		}
	}
	switch *layout {
	case "rows":
		ddl, err = outbox.RowsSchema(c.table)
		want = outbox.LayoutRows
	case "log":
		ddl, err = outbox.Schema(c.table)
		want = outbox.LayoutLog
	default:
		return c.usageError("--layout must be rows or log (got %q)", *layout)
	}
	if err != nil {
		return err
	}
	if *apply && !checked {
		if err := c.checkLayout(ctx, want); err != nil {
			return err
		}
	}
	if *orderedTable {
		order := outbox.OrderSchema
		if want == outbox.LayoutLog {
			order = outbox.LogOrderSchema
		}
		more, err := order(c.table)
		if err != nil {
			return err
		}
		ddl += "\n" + more
	}
	if *notify {
		more, err := outbox.NotifySchema(c.table)
		if err != nil {
			return err
		}
		ddl += "\n" + more
	}
	return c.printOrApply(ctx, ddl, *apply)
}

func cmdConvert(ctx context.Context, x *cli, args []string) error {
	c := newCommon("convert", x, outbox.TableDefault)
	to := c.fs.String("to", "", "log: the log layout (unordered tables); ordered: an ordered table, whose writers take each key's turn; unordered: an unordered one")
	dryRun := c.fs.Bool("dry-run", false, "count the messages concerned and print the DDL, and change nothing")
	lockTimeout := c.fs.Duration("lock-timeout", 5*time.Second, "how long to wait for the writers in progress before giving up (writers wait for the conversion meanwhile)")
	if err := c.parse(args); err != nil {
		return err
	}
	switch *to {
	case "log", "ordered", "unordered":
	default:
		return c.usageError("--to must be log, ordered or unordered (got %q)", *to)
	}
	if *lockTimeout < time.Millisecond {
		return c.usageError("--lock-timeout must be at least 1ms (got %s): it bounds the wait for the writers in progress, who wait for the conversion meanwhile", *lockTimeout)
	}
	db, store, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if *to != "log" {
		return c.convertOrdering(ctx, store, *to, *dryRun, *lockTimeout)
	}
	conv, err := store.ConvertToLog(ctx, *dryRun, *lockTimeout)
	if err != nil {
		return c.explain(err)
	}
	if *dryRun {
		fmt.Fprint(c.stdout, conv.DDL)
		fmt.Fprintf(c.stdout, "\n-- dry run: would rename %s to %s (keeping its %d published message(s) as history), create the table above and copy %d message(s) to publish and %d failed or parked one(s); nothing was changed\n",
			c.table, conv.OldTable, conv.History, conv.Pending, conv.Failed)
		return nil
	}
	fmt.Fprintf(c.stdout, "converted %s to the log layout in %s: %d message(s) to publish and %d failed or parked one(s) copied; its history (%d published) is in %s, to drop when you no longer need it\n",
		c.table, conv.Took.Round(time.Millisecond), conv.Pending, conv.Failed, conv.History, conv.OldTable)
	return nil
}

// convertOrdering makes the table ordered or unordered.
func (c *common) convertOrdering(ctx context.Context, store *outbox.Store, to string, dryRun bool, lockTimeout time.Duration) error {
	mode := outbox.Unordered
	if to == "ordered" {
		mode = outbox.OrderedByKey
	}
	conv, err := store.ConvertOrdering(ctx, mode, dryRun, lockTimeout)
	if err != nil {
		return c.explain(err)
	}
	word := map[outbox.Ordering]string{outbox.Unordered: "unordered", outbox.OrderedByKey: "ordered"}
	switch {
	case conv.DDL == "":
		fmt.Fprintf(c.stdout, "%s is an %s table already: nothing to do (%d message(s) pending)\n", c.table, word[mode], conv.Pending)
	case dryRun:
		fmt.Fprint(c.stdout, conv.DDL)
		fmt.Fprintf(c.stdout, "\n-- dry run: %s is an %s table; the DDL above would make it %s (%d message(s) pending, %d held); nothing was changed\n",
			c.table, word[conv.From], word[mode], conv.Pending, conv.Held)
	default:
		fmt.Fprintf(c.stdout, "made %s an %s table in %s (writers waited that long at most); running relays follow within a second; %d message(s) pending\n",
			c.table, word[mode], conv.Took.Round(time.Millisecond), conv.Pending)
		if mode == outbox.OrderedByKey {
			fmt.Fprintf(c.stdout, "per-key order holds for the messages written from now on; configure its stores OrderedByKey to say so (a relay so configured refuses an unordered table)\n")
		}
	}
	return nil
}

// checkLayout refuses to apply the DDL of one layout to an existing table
// of another.
func (c *common) checkLayout(ctx context.Context, want outbox.Layout) error {
	have, exists, err := c.existingLayout(ctx)
	if !exists {
		return err
	}
	if err != nil && !(want == outbox.LayoutLog && have == outbox.LayoutLog) {
		return err // (a log table of an earlier version is brought up to date by its DDL, idempotent)
	}
	if have != want {
		return fmt.Errorf("table %s exists with the %s layout: this is the DDL of the %s layout (--layout %s)", c.table, have, want, have)
	}
	return nil
}

// existingLayout reads the layout of the table when it exists (see
// outbox.Store.Layout: LayoutLog with an error for a log table of an
// earlier version).
func (c *common) existingLayout(ctx context.Context) (layout outbox.Layout, exists bool, err error) {
	db, err := c.openDB(ctx)
	if err != nil {
		return 0, false, err
	}
	defer db.Close()
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", c.table).Scan(&exists); err != nil {
		return 0, false, err
	}
	// Read only to choose the DDL, which brings the table up to date:
	// a warning that it is not (an older claim function) is not for here.
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: c.table, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, exists, err
	}
	layout, err = store.Layout(ctx)
	if !exists && !errors.Is(err, outbox.ErrInvalidTable) {
		return 0, false, nil // to create (a name of another table's side object is refused)
	}
	return layout, exists, err
}

// printOrApply prints ddl, or runs it in the database when apply is set.
func (c *common) printOrApply(ctx context.Context, ddl string, apply bool) error {
	if !apply {
		_, err := fmt.Fprint(c.stdout, ddl)
		return err
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("creating %s: %w%s", c.table, err, outbox.DuplicateIDsAdvice(c.table, err))
	}
	fmt.Fprintf(c.stdout, "table %s is ready\n", c.table)
	return nil
}

// mysqlSchema is `outbox schema` on MySQL or MariaDB: one layout, rows,
// without NOTIFY; --ordered adds the order trigger (applied only when the
// table does not have it).
func (c *common) mysqlSchema(ctx context.Context, apply bool, layout string, ordered, notify bool) error {
	switch {
	case layout != "" && layout != "rows":
		return c.usageError("--layout %s: on MySQL and MariaDB a table has the rows layout only (leave --layout out)", layout)
	case notify:
		return c.usageError("--notify: LISTEN/NOTIFY is PostgreSQL's; on MySQL and MariaDB relays poll (--poll-interval)")
	}
	ddl, err := outbox.MySQLSchema(c.table)
	if err != nil {
		return err
	}
	if ordered {
		more, err := outbox.MySQLOrderSchema(c.table)
		if err != nil {
			return err
		}
		ddl += "\n-- The order trigger. With the mysql client, run it between DELIMITER // and DELIMITER ;\n" + more
	}
	if !apply {
		_, err := fmt.Fprint(c.stdout, ddl)
		return err
	}
	cfg := &outbox.StoreConfig{}
	if ordered {
		cfg.Ordering = outbox.OrderedByKey
	}
	db, store, err := c.open(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "table %s is ready\n", c.table)
	return nil
}
