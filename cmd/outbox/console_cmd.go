package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/console"
	"github.com/acemq/outbox/inbox"
)

// consoleLimits bound what the console's clients can hold.
var consoleLimits = serveLimits{readHeader: 5 * time.Second, write: 30 * time.Second, idle: 60 * time.Second, maxConns: 32}

// cmdConsole serves the operator's console (package console) until its
// context ends.
func cmdConsole(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("console", x)
	addr := c.fs.String("addr", "127.0.0.1:8080", "the `address` to serve on; other than loopback only with credentials: OUTBOX_CONSOLE_TOKEN, or OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD, from the environment")
	readOnly := c.fs.Bool("read-only", false, "show, never act: no retry, discard or publish-now")
	var inboxes tablesFlag
	c.fs.Var(&inboxes, "inbox", "a consumer's inbox to show, as `CONSUMER@TABLE` (its dead letters; once for each)")
	var deadQueues tablesFlag
	c.fs.Var(&deadQueues, "dead-letter-queue", "an --inbox's dead-letter queue, as `CONSUMER@TABLE=QUEUE`: the console shows what waits there and replays it (once for each)")
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp+"; used by --dead-letter-queue only")
	if err := c.parse(args); err != nil {
		return err
	}
	cfg := console.Config{
		Token: c.getenv("OUTBOX_CONSOLE_TOKEN"), User: c.getenv("OUTBOX_CONSOLE_USER"), Password: c.getenv("OUTBOX_CONSOLE_PASSWORD"),
		ReadOnly: *readOnly,
	}
	c.secrets.add(cfg.Token, cfg.Password)
	if (cfg.User == "") != (cfg.Password == "") {
		return c.usageError("OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD go together: set both or neither")
	}
	loopback, err := isLoopback(*addr)
	if err != nil {
		return c.usageError("--addr %s: %v", *addr, err)
	}
	if !loopback && !cfg.HasCredentials() {
		return c.usageError("--addr %s is reachable from other machines, and no credentials are set: set OUTBOX_CONSOLE_TOKEN (or OUTBOX_CONSOLE_USER and OUTBOX_CONSOLE_PASSWORD) in the environment, or serve on 127.0.0.1", *addr)
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, nil))
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(4) // a page's statements run one after another
	if err := c.consoleSources(ctx, db, &cfg, inboxes, logger); err != nil {
		return err
	}
	if len(deadQueues) > 0 {
		cfg.DeadLetterQueues = map[string]string{}
		for _, spec := range deadQueues {
			name, q, ok := strings.Cut(spec, "=")
			if !ok || q == "" || !slices.Contains(inboxes, name) {
				return c.usageError("--dead-letter-queue %q: give CONSUMER@TABLE=QUEUE, the inbox as an --inbox gives it", spec)
			}
			cfg.DeadLetterQueues[name] = q
		}
		if _, _, err := c.amqpDialer(*amqpURL, "acemq-outbox-console"); err != nil {
			return err
		}
		cfg.Broker = func(ctx context.Context) (*amqp.Connection, error) {
			return dialAny(ctx, c, *amqpURL, "acemq-outbox-console")
		}
	}
	cfg.Logger = logger
	h, err := console.Handler(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *addr, err)
	}
	srv := serveHTTP(ln, h, consoleLimits, logger)
	logger.Info("console: Serving", slog.String("url", "http://"+ln.Addr().String()+"/"), slog.Int("tables", len(cfg.Stores)), slog.Int("inboxes", len(cfg.Inboxes)),
		slog.Bool("authenticated", cfg.HasCredentials()), slog.Bool("read_only", cfg.ReadOnly))
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// consoleSources opens a store for each table of --table and --tables,
// and an inbox for each --inbox, into cfg.
func (c *common) consoleSources(ctx context.Context, db *sql.DB, cfg *console.Config, inboxes []string, logger *slog.Logger) error {
	names := slices.Clone(c.tables)
	if len(names) == 0 && c.pattern == "" {
		names = []string{outbox.TableDefault}
	}
	for _, t := range names { // a bad name needs no connection
		if _, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: t}); err != nil {
			return c.usageError("--table: %v", err)
		}
	}
	if c.pattern != "" {
		found, err := outbox.FindTables(ctx, db, c.pattern)
		if err != nil {
			return c.explain(err)
		}
		for _, t := range found {
			if !slices.Contains(names, t) {
				names = append(names, t)
			}
		}
		if len(names) == 0 {
			return fmt.Errorf("no outbox table matches --tables %s", c.pattern)
		}
	}
	for _, t := range names {
		s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: t, Logger: logger})
		if err != nil {
			return err
		}
		cfg.Stores = append(cfg.Stores, s)
	}
	for _, spec := range inboxes {
		consumer, table, ok := strings.Cut(spec, "@")
		if !ok || consumer == "" || table == "" {
			return c.usageError("--inbox %q: give CONSUMER@TABLE, e.g. billing@inbox", spec)
		}
		ib, err := inbox.New(db, &inbox.Config{Consumer: consumer, Table: table, Logger: logger})
		if err != nil {
			return c.usageError("--inbox %q: %v", spec, err)
		}
		cfg.Inboxes = append(cfg.Inboxes, ib)
	}
	return nil
}

// isLoopback says whether addr's host is a loopback address (or
// localhost); an empty host is every interface.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
