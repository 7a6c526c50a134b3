// Package pgpair starts a throwaway PostgreSQL primary and a streaming
// standby of it on this machine, for the failover tests: each in a
// directory of its own under the system's temporary directory, on ports of
// its own (never the shared 5432), with the server binaries of the
// installed PostgreSQL (initdb, pg_ctl, pg_basebackup). Running as root, the
// servers run as the postgres user, as PostgreSQL requires.
//
// Tests that use it run only when OUTBOX_FAILOVER_TEST=1: a pair takes a
// few seconds to start and holds two servers' memory.
package pgpair

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/acemq/outbox/internal/tcpproxy"
)

// dirPrefix names the directories of pairs, so that a run killed before
// its cleanup is cleaned up by the next (see sweep).
const dirPrefix = "outbox-pgpair-"

// Node is one server of a pair.
type Node struct {
	Name string // "a" or "b"
	Port int
	dir  string
	p    *Pair
}

// Pair is a primary (A, at first) and its standby (B).
type Pair struct {
	tb   testing.TB
	root string
	bin  string
	// Sync says that the primary waits for the standby's flush before a
	// commit returns (synchronous_standby_names = '*').
	Sync  bool
	A, B  *Node
	proxy *tcpproxy.Proxy // the standby's replication connection goes through it (Lag)
}

// Start starts a primary and a streaming standby of it, and stops both
// when the test ends; it skips the test unless OUTBOX_FAILOVER_TEST=1.
func Start(tb testing.TB, sync bool) *Pair {
	tb.Helper()
	if os.Getenv("OUTBOX_FAILOVER_TEST") != "1" {
		tb.Skip("set OUTBOX_FAILOVER_TEST=1 to run the failover tests (a PostgreSQL primary and standby of their own, minutes)")
	}
	bin, err := binDir()
	if err != nil {
		tb.Fatal(err)
	}
	sweep()
	root, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		tb.Fatal(err)
	}
	p := &Pair{tb: tb, root: root, bin: bin, Sync: sync}
	tb.Cleanup(p.stop)
	if err := os.WriteFile(filepath.Join(root, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := p.chown(root); err != nil {
		tb.Fatal(err)
	}
	p.A = &Node{Name: "a", Port: freePort(tb), dir: filepath.Join(root, "a"), p: p}
	p.B = &Node{Name: "b", Port: freePort(tb), dir: filepath.Join(root, "b"), p: p}
	if err := p.initPrimary(); err != nil {
		tb.Fatalf("pgpair: primary: %v", err)
	}
	if err := p.initStandby(); err != nil {
		tb.Fatalf("pgpair: standby: %v", err)
	}
	return p
}

// URL is a multi-host URL of the pair, in pgx's form: a connection goes to
// whichever of the two accepts writes.
func (p *Pair) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.A.Port, p.B.Port)
}

// URL is the node's own URL.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", n.Port)
}

// DB opens a pool on the node alone, closed when the test ends.
func (n *Node) DB() *sql.DB {
	db, err := sql.Open("pgx", n.URL())
	if err != nil {
		n.p.tb.Fatal(err)
	}
	n.p.tb.Cleanup(func() { db.Close() })
	return db
}

// Promote makes the standby B a primary, and returns when it accepts
// writes.
func (p *Pair) Promote(ctx context.Context) error {
	db, err := sql.Open("pgx", p.B.URL())
	if err != nil {
		return err
	}
	defer db.Close()
	var ok bool
	if err := db.QueryRowContext(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("pgpair: promoting b: %w", err)
	}
	if !ok {
		return errors.New("pgpair: b was not promoted within 60s")
	}
	return nil
}

// Lag makes the standby receive nothing more of the primary's WAL for d
// (the proxy between them drops it): the primary goes on committing
// (asynchronously replicated) what the standby never gets, as a standby
// that falls behind. It returns after d, still dropping, with a function
// that ends the replication connection: crash the primary first, and what
// it wrote meanwhile is lost to the pair.
func (p *Pair) Lag(ctx context.Context, d time.Duration) (cut func(), err error) {
	if p.proxy.Hold() == 0 {
		return nil, errors.New("pgpair: the standby has no replication connection to hold")
	}
	select {
	case <-ctx.Done():
		p.proxy.Cut()
		return nil, ctx.Err()
	case <-time.After(d):
	}
	return func() { p.proxy.Cut() }, nil
}

// Crash stops node n at once, as a crash would (pg_ctl stop -m immediate):
// what its WAL had not sent to the standby is lost to the pair.
func (n *Node) Crash() error { return n.pgctl("stop", "-m", "immediate") }

// Stop stops node n cleanly.
func (n *Node) Stop() error { return n.pgctl("stop", "-m", "fast") }

// Fence makes node n refuse writes without closing its sessions, as an
// operator (or a failover manager) does before promoting its standby:
// default_transaction_read_only, reloaded. Every write on it then fails
// with SQLSTATE 25006.
func (n *Node) Fence(ctx context.Context) error {
	db, err := sql.Open("pgx", n.URL())
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{`ALTER SYSTEM SET default_transaction_read_only = on`, `SELECT pg_reload_conf()`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("pgpair: fencing %s: %w", n.Name, err)
		}
	}
	return nil
}

// AwaitReplay waits until the standby has replayed everything the primary
// has written so far.
func (p *Pair) AwaitReplay(ctx context.Context) error {
	a, err := sql.Open("pgx", p.A.URL())
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := sql.Open("pgx", p.B.URL())
	if err != nil {
		return err
	}
	defer b.Close()
	var lsn string
	if err := a.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return err
	}
	for {
		var done bool
		if err := b.QueryRowContext(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgpair: the standby did not replay up to %s: %w", lsn, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Pair) initPrimary() error {
	a := p.A
	if err := p.run(filepath.Join(p.bin, "initdb"), "-D", a.dir, "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		return err
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(a.Port),
		"unix_socket_directories = '" + p.root + "'",
		"wal_level = replica", "max_wal_senders = 4", "wal_keep_size = '512MB'", "hot_standby = on",
		"max_connections = 100", "shared_buffers = '64MB'",
		"log_min_messages = warning",
	}
	if p.Sync {
		conf = append(conf, "synchronous_standby_names = '*'")
	}
	if err := appendFile(filepath.Join(a.dir, "postgresql.conf"), strings.Join(conf, "\n")+"\n"); err != nil {
		return err
	}
	if err := appendFile(filepath.Join(a.dir, "pg_hba.conf"), "host replication all 127.0.0.1/32 trust\n"); err != nil {
		return err
	}
	return a.start()
}

func (p *Pair) initStandby() error {
	a, b := p.A, p.B
	if err := p.run(filepath.Join(p.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(a.Port), "-U", "postgres",
		"-D", b.dir, "-X", "stream", "-R", "-c", "fast", "--no-sync"); err != nil {
		return err
	}
	// The standby's own settings: its port, and no synchronous standby of
	// its own once promoted (it has none); it streams through a proxy
	// (Lag).
	proxy, err := tcpproxy.New(fmt.Sprintf("127.0.0.1:%d", a.Port))
	if err != nil {
		return err
	}
	p.proxy = proxy
	conf := []string{
		"port = " + strconv.Itoa(b.Port),
		"synchronous_standby_names = ''",
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=b'", proxy.Addr().Port),
	}
	// postgresql.auto.conf, where pg_basebackup -R wrote its own
	// primary_conninfo: the last setting read wins.
	if err := appendFile(filepath.Join(b.dir, "postgresql.auto.conf"), strings.Join(conf, "\n")+"\n"); err != nil {
		return err
	}
	if err := b.start(); err != nil {
		return err
	}
	// Streaming (and, synchronous, counted as the synchronous standby)
	// before the test writes.
	db, err := sql.Open("pgx", a.URL())
	if err != nil {
		return err
	}
	defer db.Close()
	want := "async"
	if p.Sync {
		want = "sync"
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n); err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby is not streaming (%s) after 30s", want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *Node) start() error {
	return n.pgctl("start", "-w", "-t", "60", "-l", filepath.Join(n.p.root, n.Name+".log"))
}

func (n *Node) pgctl(args ...string) error {
	return n.p.run(filepath.Join(n.p.bin, "pg_ctl"), append([]string{"-D", n.dir}, args...)...)
}

// stop stops both servers, whatever their state, and removes the pair's
// directory.
func (p *Pair) stop() {
	for _, n := range []*Node{p.A, p.B} {
		if n != nil {
			_ = n.Crash()
		}
	}
	if p.proxy != nil {
		_ = p.proxy.Close()
	}
	if p.tb.Failed() {
		p.tb.Logf("pgpair: the servers' logs: %s/{a,b}.log (kept)", p.root)
		return
	}
	_ = os.RemoveAll(p.root)
}

// run runs a server binary, as the postgres user when this is root.
func (p *Pair) run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	cmd.Dir = p.root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return nil
}

// chown gives dir to the postgres user when this is root.
func (p *Pair) chown(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgpair: running as root needs the postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

// binDir finds the installed PostgreSQL's server binaries: $PG_BINDIR, or
// the newest under /usr/lib/postgresql (Debian's layout).
func binDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_basebackup")
	if len(found) == 0 {
		return "", errors.New("pgpair: no PostgreSQL server binaries under /usr/lib/postgresql: set PG_BINDIR")
	}
	return filepath.Dir(found[len(found)-1]), nil
}

// sweep stops the servers of pairs left by runs that were killed before
// their cleanup (the process that made them is gone), and removes their
// directories.
func sweep() {
	bin, err := binDir()
	if err != nil {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		owner, err := os.ReadFile(filepath.Join(d, "owner"))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(string(owner)); err != nil || syscall.Kill(pid, 0) == nil {
			continue // its run is alive
		}
		p := &Pair{root: d, bin: bin}
		for _, name := range []string{"a", "b"} {
			if _, err := os.Stat(filepath.Join(d, name, "postmaster.pid")); err == nil {
				_ = p.run(filepath.Join(bin, "pg_ctl"), "-D", filepath.Join(d, name), "stop", "-m", "immediate")
			}
		}
		_ = os.RemoveAll(d)
	}
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
