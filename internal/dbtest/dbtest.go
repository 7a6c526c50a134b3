// Package dbtest gives tests a connection to the real PostgreSQL named by
// TEST_DATABASE_URL and a table of their own, so that tests run in parallel
// without seeing each other's rows. A server that cannot be reached fails the
// test with instructions; it is never a silent skip.
package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"go.uber.org/goleak"

	"github.com/acemq/outbox/internal/syncbuf"
)

// URLDefault is used when TEST_DATABASE_URL is not set.
const URLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns the test database URL.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return URLDefault
}

// Redact returns u with any password replaced, for messages.
func Redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

var (
	sharedMu sync.Mutex
	shared   *sql.DB
)

// DB returns the package's shared pool, opened on first use and closed by
// Main. Tests must not close it.
func DB(tb testing.TB) *sql.DB {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		db := open(tb)
		db.SetMaxOpenConns(40)
		shared = db
	}
	return shared
}

// NewDB opens a pool of the test's own, closed when the test ends (or
// earlier, by the test).
func NewDB(tb testing.TB) *sql.DB {
	tb.Helper()
	db := open(tb)
	tb.Cleanup(func() { db.Close() })
	return db
}

func open(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open("pgx", URL())
	if err != nil {
		tb.Fatalf("dbtest: opening %s: %v", Redact(URL()), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		tb.Fatalf("dbtest: cannot reach PostgreSQL at %s: %v\n"+
			"Is it running? Start it with `docker compose up -d --wait postgres`, or on a Debian host with "+
			"`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`; "+
			"set TEST_DATABASE_URL to use another server.", Redact(URL()), err)
	}
	return db
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// Table returns a table name no other test uses ("t_<test>_<random>"), and
// drops that table, whatever created it, when the test ends.
func Table(tb testing.TB) string {
	tb.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(name) > 30 {
		name = name[len(name)-30:]
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	table := "t_" + strings.Trim(name, "_") + "_" + hex.EncodeToString(b[:])
	db := DB(tb)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP VIEW IF EXISTS "`+table+`_messages"; DROP FUNCTION IF EXISTS "`+table+`_claim"; DROP TABLE IF EXISTS "`+table+`", "`+table+`_batch", "`+table+`_settle", "`+table+`_failed", "`+table+`_log", "`+table+`_rows", "`+table+`_scheduled"; DROP FUNCTION IF EXISTS "`+table+`_id_check"`); err != nil {
			tb.Errorf("dbtest: dropping %s: %v", table, err)
		}
	})
	return table
}

// Schema returns a schema name no other test uses, created now and dropped
// with everything in it when the test ends.
func Schema(tb testing.TB) string {
	tb.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "s_" + hex.EncodeToString(b[:])
	createSchema(tb, schema)
	return schema
}

// TaggedSchemas creates a schema for each of names, "<tag>_<name>", under
// a tag no other test uses, which it returns (a pattern "<tag>_*" finds
// them all and nothing else), and drops them with everything in them
// when the test ends; a schema dropped by the test meanwhile is fine.
func TaggedSchemas(tb testing.TB, names ...string) (tag string) {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	tag = "f" + hex.EncodeToString(b[:])
	for _, n := range names {
		createSchema(tb, tag+"_"+n)
	}
	return tag
}

// createSchema creates schema, dropped when the test ends.
func createSchema(tb testing.TB, schema string) {
	tb.Helper()
	db := DB(tb)
	if _, err := db.ExecContext(context.Background(), `CREATE SCHEMA "`+schema+`"`); err != nil {
		tb.Fatalf("dbtest: creating schema: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			tb.Errorf("dbtest: dropping schema %s: %v", schema, err)
		}
	})
}

// Count runs a count query and returns its result, failing the test on error.
func Count(tb testing.TB, db *sql.DB, query string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := db.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		tb.Fatalf("dbtest: %s: %v", query, err)
	}
	return n
}

var (
	exampleMu      sync.Mutex
	exampleSchemas []string
)

// ExampleURL returns the test database's URL with search_path set to a new
// schema of the caller's own, so that an Example can use plain names
// ("outbox", "invoices") while other test runs share the server; Main drops
// the schema after the package's tests. It panics if the schema cannot be
// created: an Example has no testing.TB to fail.
func ExampleURL() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	db, err := sql.Open("pgx", URL())
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE SCHEMA "` + schema + `"`); err != nil {
		panic(fmt.Sprintf("dbtest: creating schema %s: %v", schema, err))
	}
	exampleMu.Lock()
	exampleSchemas = append(exampleSchemas, schema)
	exampleMu.Unlock()
	u, err := url.Parse(URL())
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func dropExampleSchemas() {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	if len(exampleSchemas) == 0 {
		return
	}
	db, err := sql.Open("pgx", URL())
	if err != nil {
		return
	}
	defer db.Close()
	for _, s := range exampleSchemas {
		_, _ = db.Exec(`DROP SCHEMA IF EXISTS "` + s + `" CASCADE`)
	}
	exampleSchemas = nil
}

// Main runs the tests of a package, then closes the shared pool and, if
// everything passed, fails on leaked goroutines other than those opts ignore.
//
// Unless OUTBOX_DEBUG=1, what the code under test logs to slog's default
// logger (stores and relays given no Logger) is kept to errors, so that a
// passing run prints nothing but its results.
func Main(m *testing.M, opts ...goleak.Option) {
	if os.Getenv("OUTBOX_DEBUG") != "1" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	}
	code := m.Run()
	dropExampleSchemas()
	sharedMu.Lock()
	if shared != nil {
		shared.Close()
		shared = nil
	}
	sharedMu.Unlock()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Logger returns a logger that writes to the test's log, at debug level when
// OUTBOX_DEBUG=1 and at info level otherwise.
func Logger(tb testing.TB) *slog.Logger { return LoggerTo(tb, nil) }

// LoggerTo is Logger that also writes to w (when not nil), for tests that
// assert what was logged.
func LoggerTo(tb testing.TB, w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("OUTBOX_DEBUG") == "1" {
		level = slog.LevelDebug
	}
	var out io.Writer = testWriter{tb}
	if w != nil {
		out = io.MultiWriter(w, out)
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// SchemaDB returns a pool of the test's own whose connections resolve
// unqualified table names in a schema of the test's own (search_path), for
// code such as ent's that cannot be told table names.
func SchemaDB(tb testing.TB) (*sql.DB, string) {
	tb.Helper()
	schema := Schema(tb)
	dsn := URLWith(tb, "search_path", schema)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatalf("dbtest: opening %s: %v", Redact(dsn), err)
	}
	tb.Cleanup(func() { db.Close() })
	return db, schema
}

// URLWith returns the test database URL with one more query parameter, such
// as application_name or search_path.
func URLWith(tb testing.TB, key, value string) string {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("dbtest: TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// EventKeys returns "event_type/event_key" of every row of an outbox table
// (name already quoted or schema-qualified as needed), oldest first, read on
// db: with a pool other than the writer's, only committed rows show.
func EventKeys(tb testing.TB, db *sql.DB, table string) []string {
	tb.Helper()
	out := []string{}
	pairs(tb, db, table, `SELECT event_type, event_key FROM `+table+` ORDER BY seq`, func(typ, key string) {
		out = append(out, typ+"/"+key)
	})
	return out
}

// IDsByKey returns the ids of every row of an outbox table with a key, by
// key, in the order ordered mode keeps: seq on a table of the rows layout;
// on one of the log layout ord, after the rows written before it was made
// ordered (no ord), in the order of seq.
func IDsByKey(tb testing.TB, db *sql.DB, table string) map[string][]string {
	tb.Helper()
	out := map[string][]string{}
	order := "seq"
	if Count(tb, db, `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'ord' AND NOT attisdropped`, table) == 1 {
		order = "ord NULLS FIRST, seq"
	}
	pairs(tb, db, table, `SELECT event_key, id FROM `+table+` WHERE event_key <> '' ORDER BY `+order, func(key, id string) {
		out[key] = append(out[key], id)
	})
	return out
}

// pairs runs query, which reads two text columns of table, and calls f
// with each row's.
func pairs(tb testing.TB, db *sql.DB, table, query string, f func(a, b string)) {
	tb.Helper()
	rows, err := db.Query(query)
	if err != nil {
		tb.Fatalf("dbtest: reading %s: %v", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			tb.Fatalf("dbtest: reading %s: %v", table, err)
		}
		f(a, b)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("dbtest: reading %s: %v", table, err)
	}
}

// AwaitAdvisoryWait waits until the session pid waits for an advisory
// lock, as a second writer of a key in ordered mode does, seen from db.
func AwaitAdvisoryWait(tb testing.TB, db *sql.DB, pid int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for Count(tb, db, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'", pid) != 1 {
		if time.Now().After(deadline) {
			tb.Fatalf("dbtest: session %d did not come to wait for an advisory lock within 10s", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Buffer is a bytes.Buffer that a test can read while another goroutine
// (a relay, a command's logger) writes to it.
type Buffer = syncbuf.Buffer

// LogLayout says whether OUTBOX_TEST_LAYOUT=log asks the suites to run
// their unordered tests on tables of the log layout.
func LogLayout() bool { return os.Getenv("OUTBOX_TEST_LAYOUT") == "log" }

// EnvInt reads a positive count from the environment variable name (the
// size of a slow test or a benchmark), def when it is unset; a value that
// is not a positive integer fails tb.
func EnvInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// Await polls cond every 20ms until it holds, and fails when within has
// passed first (or ctx ends): a condition awaited, not a sleep.
func Await(ctx context.Context, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
