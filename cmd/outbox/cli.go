package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/pgwake"
	"github.com/acemq/outbox/relay"
)

const usage = `outbox: the relay and operator tool of github.com/acemq/outbox

Usage:
  outbox relay   [flags]             publish the outbox to RabbitMQ until SIGINT/SIGTERM
  outbox status  [flags]             pending, claimed, parked, oldest pending age
  outbox parked  [flags]             list parked messages with their last errors
  outbox retry   [flags] ID...       re-arm parked messages (--all-parked for all of them)
  outbox purge   --older-than 168h   delete published messages older than that
  outbox schema  [flags]             print the table's DDL (--apply creates it)
  outbox bench   [flags]             measure relay throughput and latency on a scratch table

The database comes from --database-url or DATABASE_URL, the broker from
--amqp-url or AMQP_URL (comma-separated URLs for the nodes of a cluster).
Run "outbox <command> -h" for a command's flags.
`

// errUsage marks errors already explained by the flag package.
var errUsage = errors.New("usage")

type env func(string) string

// run executes one command and returns the process exit code: 0 success,
// 1 failure, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	commands := map[string]func(context.Context, []string, io.Writer, io.Writer, env) error{
		"relay":  cmdRelay,
		"status": cmdStatus,
		"parked": cmdParked,
		"retry":  cmdRetry,
		"purge":  cmdPurge,
		"schema": cmdSchema,
		"bench":  cmdBench,
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "outbox: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := cmd(ctx, args[1:], stdout, stderr, getenv)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage), errors.Is(err, flag.ErrHelp):
		return 2
	default:
		fmt.Fprintf(stderr, "outbox %s: %v\n", args[0], err)
		return 1
	}
}

// common holds the flags every database command has.
type common struct {
	fs          *flag.FlagSet
	databaseURL string
	table       string
}

func newCommon(name string, stderr io.Writer, getenv env, withTable ...bool) *common {
	c := &common{fs: flag.NewFlagSet("outbox "+name, flag.ContinueOnError), table: outbox.TableDefault}
	c.fs.SetOutput(stderr)
	c.fs.StringVar(&c.databaseURL, "database-url", getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	if len(withTable) == 0 || withTable[0] {
		c.fs.StringVar(&c.table, "table", outbox.TableDefault, "outbox table, optionally schema-qualified")
	}
	return c
}

func (c *common) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		return errUsage
	}
	return nil
}

// open connects to the database, with errors that say what to do, and
// returns a store on the command's table configured by cfg (nil: defaults).
func (c *common) open(ctx context.Context, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store, error) {
	if c.databaseURL == "" {
		return nil, nil, errors.New("no database: set DATABASE_URL or pass --database-url (e.g. postgres://user@localhost:5432/app)")
	}
	db, err := sql.Open("pgx", c.databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database URL %s: %w", redact(c.databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w\nCheck that the server runs and DATABASE_URL is right", redact(c.databaseURL), err)
	}
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Table = c.table
	store, err := outbox.NewStore(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

// explain turns a missing table into advice.
func (c *common) explain(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("table %q does not exist in this database: create it with `outbox schema --apply --table %s` or your migrations (migrations/ in the module)", c.table, c.table)
	}
	return err
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(the configured URL)"
	}
	return p.Redacted()
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("status", stderr, getenv)
	if err := c.parse(args); err != nil {
		return err
	}
	db, store, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := store.Stats(ctx)
	if err != nil {
		return c.explain(err)
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "table\t%s\n", c.table)
	fmt.Fprintf(w, "pending\t%d\n", st.Pending)
	fmt.Fprintf(w, "claimed\t%d\n", st.Claimed)
	fmt.Fprintf(w, "parked\t%d\n", st.Parked)
	fmt.Fprintf(w, "oldest pending\t%s\n", st.OldestPendingAge.Round(time.Second))
	fmt.Fprintf(w, "published last hour\t%d\n", st.PublishedLastHour)
	if st.Parked > 0 {
		fmt.Fprintf(w, "\nparked messages need a look: outbox parked --table %s\n", c.table)
	}
	return w.Flush()
}

func cmdParked(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("parked", stderr, getenv)
	limit := c.fs.Int("limit", 50, "most messages to list, most recently parked first")
	if err := c.parse(args); err != nil {
		return err
	}
	db, store, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	msgs, err := store.Parked(ctx, *limit)
	if err != nil {
		return c.explain(err)
	}
	if len(msgs) == 0 {
		fmt.Fprintln(stdout, "no parked messages")
		return nil
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tEVENT TYPE\tATTEMPTS\tPARKED AT\tLAST ERROR")
	for _, m := range msgs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", m.ID, m.EventType, m.Attempts, m.ParkedAt.UTC().Format(time.RFC3339), oneLine(m.LastError, 120))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nre-arm with: outbox retry --table %s ID... (or --all-parked)\n", c.table)
	return nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func cmdRetry(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("retry", stderr, getenv)
	all := c.fs.Bool("all-parked", false, "re-arm every parked message")
	if err := c.parse(args); err != nil {
		return err
	}
	ids := c.fs.Args()
	if *all == (len(ids) > 0) {
		fmt.Fprintln(stderr, "outbox retry: give message ids or --all-parked (not both)")
		return errUsage
	}
	db, store, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int64
	if *all {
		n, err = store.RetryAllParked(ctx)
	} else {
		n, err = store.Retry(ctx, ids...)
	}
	if err != nil {
		return c.explain(err)
	}
	fmt.Fprintf(stdout, "re-armed %d parked message(s)\n", n)
	if !*all && int(n) < len(ids) {
		fmt.Fprintf(stdout, "%d id(s) were not parked messages of %s and were left alone\n", len(ids)-int(n), c.table)
	}
	return nil
}

func cmdPurge(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("purge", stderr, getenv)
	olderThan := c.fs.Duration("older-than", 0, "delete published messages older than this (e.g. 168h); required")
	batch := c.fs.Int("batch-size", outbox.PurgeBatchSizeDefault, "rows deleted per statement")
	if err := c.parse(args); err != nil {
		return err
	}
	if *olderThan <= 0 {
		fmt.Fprintln(stderr, "outbox purge: --older-than is required and must be positive, e.g. --older-than 168h")
		return errUsage
	}
	db, store, err := c.open(ctx, &outbox.StoreConfig{PurgeBatchSize: *batch})
	if err != nil {
		return err
	}
	defer db.Close()
	started := time.Now()
	last := started
	n, err := store.PurgePublishedProgress(ctx, *olderThan, func(total int64) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "purged %d so far (%.0f rows/s)\n", total, float64(total)/time.Since(started).Seconds())
		}
	})
	if err != nil {
		return fmt.Errorf("after purging %d: %w", n, c.explain(err))
	}
	fmt.Fprintf(stdout, "purged %d published message(s) older than %s in %s\n", n, *olderThan, time.Since(started).Round(time.Millisecond))
	return nil
}

func cmdSchema(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("schema", stderr, getenv)
	apply := c.fs.Bool("apply", false, "create the table in the database instead of printing the DDL")
	notify := c.fs.Bool("notify", false, "include the LISTEN/NOTIFY trigger that wakes relays at once (costs write throughput; see README)")
	if err := c.parse(args); err != nil {
		return err
	}
	ddl, err := outbox.Schema(c.table)
	if err != nil {
		return err
	}
	if *notify {
		more, err := outbox.NotifySchema(c.table)
		if err != nil {
			return err
		}
		ddl += "\n" + more
	}
	if !*apply {
		_, err := fmt.Fprint(stdout, ddl)
		return err
	}
	db, _, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("creating %s: %w", c.table, err)
	}
	fmt.Fprintf(stdout, "table %s is ready\n", c.table)
	return nil
}

func cmdRelay(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) error {
	c := newCommon("relay", stderr, getenv)
	amqpURL := c.fs.String("amqp-url", getenv("AMQP_URL"), "RabbitMQ URL(s), comma-separated for a cluster (default $AMQP_URL, else amqp://guest:guest@localhost:5672/)")
	batch := c.fs.Int("batch-size", relay.BatchSizeDefault, "messages per claim")
	lease := c.fs.Duration("lease", relay.LeaseDefault, "how long a claim holds; another relay takes over a dead relay's batch after it")
	poll := c.fs.Duration("poll-interval", relay.PollIntervalDefault, "sleep between polls when idle")
	publishTimeout := c.fs.Duration("publish-timeout", relay.PublishTimeoutDefault, "bound on publishing one batch (must be shorter than --lease)")
	shutdown := c.fs.Duration("shutdown-timeout", relay.ShutdownTimeoutDefault, "how long to wait for confirms on SIGINT/SIGTERM before releasing")
	maxAttempts := c.fs.Int("max-attempts", outbox.MaxAttemptsDefault, "failed attempts after which a message is parked")
	purgeAfter := c.fs.Duration("purge-after", 0, "also purge published messages older than this, hourly (0: never)")
	notify := c.fs.Bool("notify", false, "wake on LISTEN/NOTIFY (needs `outbox schema --notify`) instead of waiting for the next poll")
	name := c.fs.String("connection-name", relay.ConnectionNameDefault, "connection name shown in RabbitMQ's management UI")
	debug := c.fs.Bool("debug", false, "log every batch")
	if err := c.parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	db, store, err := c.open(ctx, &outbox.StoreConfig{MaxAttempts: *maxAttempts, Logger: logger})
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := store.Pending(ctx); err != nil {
		return c.explain(err)
	}
	var urls []string
	for _, u := range strings.Split(*amqpURL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URLs: urls, ConnectionName: *name, Logger: logger})
	if err != nil {
		return err
	}
	defer pub.Close()
	cfg := &relay.Config{
		BatchSize: *batch, Lease: *lease, PollInterval: *poll, PublishTimeout: *publishTimeout,
		ShutdownTimeout: *shutdown, PurgeAfter: *purgeAfter, Logger: logger,
	}
	if *notify {
		if cfg.Wakeup, err = pgwake.Listen(ctx, &pgwake.Config{DatabaseURL: c.databaseURL, Table: c.table, Logger: logger}); err != nil {
			return err
		}
	}
	r, err := relay.New(store, pub, cfg)
	if err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil {
		return err
	}
	st := r.Stats()
	fmt.Fprintf(stdout, "relay stopped: %d published, %d failed, %d released, %d leases lost\n", st.Published, st.Failed, st.Released, st.LeasesLost)
	return nil
}
