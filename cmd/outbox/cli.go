package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dberr"
	"github.com/acemq/outbox/internal/redact"
)

const usage = `outbox: the relay and operator tool of github.com/acemq/outbox

Usage:
  outbox relay   [flags]             publish the outbox to RabbitMQ until SIGINT/SIGTERM
  outbox status  [flags]             pending, claimed, parked, oldest pending age, blocked keys
  outbox parked  [flags]             list parked messages with their keys and last errors
  outbox retry   [flags] ID...       re-arm parked messages (--all-parked for all of them)
  outbox discard [flags] ID...       give up on parked messages, keeping their record
  outbox scheduled [flags] [ID...]   list delayed messages (--publish-now or --discard ID...)
  outbox purge   --older-than 168h   delete published messages older than that
  outbox console [flags]             the operator's console in the browser (--addr 127.0.0.1:8080)
  outbox schema  [flags]             print the table's DDL (--apply creates it; --layout rows|log; --ordered)
  outbox convert --to log|ordered|unordered
                                     turn a table of the rows layout into one of the log layout, or make it
                                     ordered or unordered, online (--dry-run)
  outbox declare [flags]             declare exchanges, queues, bindings and dead-letter queues (--dry-run)
  outbox bench   [flags]             measure relay throughput and latency on a scratch table
  outbox verify  [flags]             prove this database and broker keep the promise, under faults
  outbox inbox   schema|purge|dead|retry|replay
                                     the consumers' inbox table and dead letters (package inbox)
  outbox version                     the binary's version (also --version)

The database comes from --database-url or DATABASE_URL, the broker from
--amqp-url or AMQP_URL (comma-separated URLs for the nodes of a cluster).
Run "outbox <command> -h" for a command's flags.
`

// errUsage marks errors already explained on stderr.
var errUsage = errors.New("usage")

type env func(string) string

// cli is what every command gets: its output (with secrets filtered out)
// and its environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         env
	secrets        *secrets
}

type command func(context.Context, *cli, []string) error

var commands = map[string]command{
	"relay":     cmdRelay,
	"status":    cmdStatus,
	"parked":    cmdParked,
	"retry":     cmdRetry,
	"discard":   cmdDiscard,
	"scheduled": cmdScheduled,
	"console":   cmdConsole,
	"purge":     cmdPurge,
	"schema":    cmdSchema,
	"convert":   cmdConvert,
	"bench":     cmdBench,
	"inbox":     cmdInbox,
	"version":   cmdVersion,
	"declare":   cmdDeclare,
	"verify":    cmdVerify,
}

// run executes one command and returns the process exit code: 0 success
// (and help asked for), 1 failure, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) int {
	sec := &secrets{}
	sec.addDSN(getenv("DATABASE_URL"))
	sec.addDSN(getenv("AMQP_URL")) // whole: a password may hold the ',' that separates nodes
	sec.addDSN(strings.Split(getenv("AMQP_URL"), ",")...)
	for _, a := range args { // a connection string given where it does not go is a secret too
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			a = v
		}
		if looksLikeDSN(a) {
			sec.addDSN(a)
		}
	}
	x := &cli{stdout: sec.writer(stdout), stderr: sec.writer(stderr), getenv: getenv, secrets: sec}

	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintln(x.stdout, version())
		return 0
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			if _, ok := commands[args[1]]; ok { // outbox help status = outbox status --help
				return run(ctx, []string{args[1], "--help"}, stdout, stderr, getenv)
			}
			fmt.Fprintf(x.stderr, "outbox: unknown command %q\n\n%s", args[1], usage)
			return 2
		}
		fmt.Fprint(x.stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(x.stderr, "outbox: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := cmd(ctx, x, args[1:])
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(x.stderr, "outbox %s: %v\n", args[0], err)
		return 1
	}
}

// common holds the flags every database command has, and parses them.
type common struct {
	*cli
	name        string
	fs          *flag.FlagSet
	databaseURL string
	table       string
	tables      tablesFlag // an operator command's --table, given once for each table (see newOperatorCommon)
	pattern     string     // an operator command's --tables
	positional  string     // what positional arguments the command takes ("ID..."); "" for none
	args        []string   // the positional arguments given
}

// newCommon starts a command's flags: --database-url, and --table with
// the given default unless table is "" (a command on a table of its own).
func newCommon(name string, x *cli, table string) *common {
	c := newBrokerCommon(name, x)
	c.table = table
	// The default is never taken from the environment here: flag prints
	// defaults in its usage text, and DATABASE_URL holds a password.
	c.fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL or keyword/value string, or MySQL/MariaDB URL (mysql://user@host:3306/db) or DSN (default $DATABASE_URL)")
	if table != "" {
		c.fs.Var(&onceFlag{p: &c.table}, "table", "the `table`, optionally schema-qualified")
	}
	return c
}

// newBrokerCommon starts the flags of a command that does not use the
// database (outbox declare, outbox inbox replay): no --database-url, no
// --table.
func newBrokerCommon(name string, x *cli) *common {
	c := &common{cli: x, name: name, fs: flag.NewFlagSet("outbox "+name, flag.ContinueOnError)}
	c.fs.SetOutput(x.stderr)
	c.fs.Usage = func() {
		fmt.Fprintf(c.fs.Output(), "Usage: %s\n\nFlags:\n", strings.TrimSpace("outbox "+name+" [flags] "+c.positional))
		c.fs.PrintDefaults()
	}
	return c
}

// onceFlag is a string flag that may be given once: a second --table
// would otherwise silently replace the first (a command, a relay included,
// works on one table).
type onceFlag struct {
	p   *string
	set bool
}

func (f *onceFlag) String() string {
	if f == nil || f.p == nil {
		return ""
	}
	return *f.p
}

func (f *onceFlag) Set(v string) error {
	if f.set {
		return errors.New("given twice: give it once (a command works on one table)")
	}
	*f.p, f.set = v, true
	return nil
}

// Get makes the flag one whose emptiness parse checks.
func (f *onceFlag) Get() any { return *f.p }

// parse parses flags wherever they stand among the positional arguments,
// refuses empty string flags and positional arguments the command does not
// take, and fills in DATABASE_URL.
func (c *common) parse(args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			c.fs.SetOutput(c.stdout)
			c.fs.Usage()
			return flag.ErrHelp
		}
	}
	for {
		if err := c.fs.Parse(args); err != nil {
			return errUsage // flag has explained it, with the usage
		}
		args = c.fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			c.args = append(c.args, args[1:]...)
			break
		}
		c.args = append(c.args, args[0])
		args = args[1:]
	}
	var empty []string
	c.fs.Visit(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if v, ok := g.Get().(string); ok && strings.TrimSpace(v) == "" {
				empty = append(empty, "--"+f.Name)
			}
		}
	})
	if len(empty) > 0 {
		return c.usageError("%s is empty; give a value or leave the flag out", strings.Join(empty, ", "))
	}
	for i, a := range c.args {
		if looksLikeDSN(a) {
			return c.usageError("argument %d looks like a connection string (not shown: it may hold a password); give the database with --database-url or DATABASE_URL", i+1)
		}
	}
	if looksLikeDSN(c.table) {
		return c.usageError("--table looks like a connection string (not shown: it may hold a password); --table takes a table name, the database goes in --database-url or DATABASE_URL")
	}
	if c.positional == "" && len(c.args) > 0 {
		return c.usageError("unexpected argument %q: this command takes only flags (--name value)", c.args[0])
	}
	if c.databaseURL == "" {
		c.databaseURL = c.getenv("DATABASE_URL")
	}
	c.secrets.addDSN(c.databaseURL)
	return nil
}

// usageError explains bad usage on stderr and returns errUsage (exit 2).
func (c *common) usageError(format string, args ...any) error {
	fmt.Fprintf(c.stderr, "outbox %s: %s\nRun \"outbox %s --help\" for its flags.\n", c.name, fmt.Sprintf(format, args...), c.name)
	return errUsage
}

// positive refuses a zero or negative value of a numeric flag, which would
// otherwise silently mean "the default".
func (c *common) positive(vals map[string]int64) error {
	for name, v := range vals {
		if v <= 0 {
			return c.usageError("--%s must be positive", name)
		}
	}
	return nil
}

// checkRate refuses a --rate that is not a number of messages per second
// from 0 (from minRate unless zeroOK) to maxRate: NaN compares false with
// every bound, so it passed them.
func (c *common) checkRate(rate float64, zeroOK bool) error {
	bounds := fmt.Sprintf("between 0 and %d", maxRate)
	if !zeroOK {
		bounds = fmt.Sprintf("above 0 and at most %d", maxRate)
	}
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0):
		return c.usageError("--rate %g is not a number of messages per second: give one %s", rate, bounds)
	case rate < 0 || (rate == 0 && !zeroOK) || rate > maxRate:
		return c.usageError("--rate must be %s messages per second (got %g)", bounds, rate)
	case rate > 0 && rate < minRate:
		// The interval between writes would overflow a time.Duration
		// (and, negative, make the writers write as fast as they can).
		return c.usageError("--rate %g is too slow: at least %g messages per second (one every %s)", rate, minRate, time.Duration(float64(time.Second)/minRate))
	}
	return nil
}

// minRate is the slowest --rate above 0.
const minRate = 0.001

// open connects to the database, with errors that say what to do, and
// returns a store on the command's table configured by cfg (nil: defaults).
func (c *common) open(ctx context.Context, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store, error) {
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	cfg.Table = c.table
	if _, err := outbox.NewStore(nil, cfg); err != nil { // a bad table name needs no connection
		return nil, nil, err
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	store, err := outbox.NewStore(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

// openDB connects to the database, with errors that say what to do and
// never show the password.
func (c *common) openDB(ctx context.Context) (*sql.DB, error) {
	if c.databaseURL == "" {
		return nil, errors.New("no database: set DATABASE_URL or pass --database-url (e.g. postgres://user@localhost:5432/app, or mysql://user@localhost:3306/app for MySQL and MariaDB)")
	}
	if dsn, ok, err := mysqlDSN(c.databaseURL); ok {
		if err != nil {
			return nil, err
		}
		return c.ping(ctx, "mysql", dsn, "MySQL/MariaDB")
	}
	// pgx's own message quotes the string, or the start of a password
	// cut at a '/', '#' or '?': say only what kind of problem it is. pgx's
	// config, not pgconn's: the driver's settings (default_query_exec_mode)
	// are checked when it connects, where a mistake would read as an
	// unreachable server.
	if _, err := pgx.ParseConfig(c.databaseURL); err != nil {
		return nil, fmt.Errorf("the database URL (%s) is not a valid PostgreSQL URL or keyword/value string: %s", redactDSN(c.databaseURL), redact.Reason(err))
	}
	return c.ping(ctx, "pgx", c.databaseURL, "PostgreSQL")
}

// ping opens a pool of driver on dsn and checks that the server answers.
func (c *common) ping(ctx context.Context, driver, dsn, server string) (*sql.DB, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL %s: %s", redactDSN(c.databaseURL), c.secrets.scrub(err.Error()))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot reach %s at %s: %s\nCheck that the server runs and DATABASE_URL is right", server, redactDSN(c.databaseURL), c.secrets.scrub(err.Error()))
	}
	return db, nil
}

// onMySQL reports whether the command's database is MySQL or MariaDB.
func (c *common) onMySQL() bool {
	_, ok, _ := mysqlDSN(c.databaseURL)
	return ok
}

// explain turns a missing table or column into advice. The state is the
// server's, or the store's own (a table Store.Layout found missing).
func (c *common) explain(err error) error {
	switch dberr.Classify(err) {
	case dberr.NoTable:
		return fmt.Errorf("table %q does not exist in this database: create it with `outbox schema --apply --table %s` or your migrations (migrations/ in the module)", c.table, c.table)
	case dberr.NoColumn:
		msg := err.Error()
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
			msg = pgErr.Message
		}
		return fmt.Errorf("table %q exists but is not an outbox table of this version (%s): compare it with `outbox schema --table %s`, and apply the module's migrations/ if it is an older outbox", c.table, msg, c.table)
	case dberr.Pooler:
		return fmt.Errorf("%w (%s)", err, outbox.PoolerHint)
	}
	return err
}
