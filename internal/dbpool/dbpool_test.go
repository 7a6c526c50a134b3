package dbpool_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/acemq/outbox/internal/dbpool"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
)

// backendPID names the server session behind one of db's connections.
func backendPID(t *testing.T, c *sql.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestLeaveClosesOnlyReadOnlyConnections proves that a sweep closes the
// pool's connections whose sessions accept no writes (here made so with
// default_transaction_read_only, as ALTER SYSTEM does to a fenced
// primary's sessions on reload) and keeps the others, on the real
// PostgreSQL.
func TestLeaveClosesOnlyReadOnlyConnections(t *testing.T) {
	ctx := context.Background()
	db := dbtest.NewDB(t)
	db.SetMaxIdleConns(3)
	var conns []*sql.Conn
	pids := map[int]bool{}
	for i := range 3 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pids[backendPID(t, c)] = i == 0
		if i == 0 {
			if _, err := c.ExecContext(ctx, `SET default_transaction_read_only = on`); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	var l dbpool.Leaver
	if n := l.Leave(ctx, db, dbpool.Query(false)); n != 1 {
		t.Fatalf("Leave closed %d connections, want the 1 read-only one", n)
	}
	if idle := db.Stats().Idle; idle != 2 {
		t.Fatalf("%d connections idle after the sweep, want the 2 writable ones", idle)
	}
	// The pool's connections now are the writable ones only.
	for range 2 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		pid := backendPID(t, c)
		if ro, ok := pids[pid]; !ok || ro {
			t.Fatalf("the pool handed out session %d after the sweep (known: %v; true = read-only)", pid, pids)
		}
	}
	// A second sweep at once is refused: sweeps are rate-limited.
	if n := l.Leave(ctx, db, dbpool.Query(false)); n != 0 {
		t.Fatalf("a sweep less than %v after the last closed %d connections", dbpool.MinInterval, n)
	}
}

// TestLeaveKeepsWritableMySQLConnections proves that the MySQL check runs
// on MariaDB and closes nothing on a writable server (its read_only is a
// global setting: a test cannot make one session read-only).
func TestLeaveKeepsWritableMySQLConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := mysqltest.DB(t)
	db.SetMaxIdleConns(2)
	c1, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.Close()
	var l dbpool.Leaver
	if n := l.Leave(ctx, db, dbpool.Query(true)); n != 0 {
		t.Fatalf("Leave closed %d connections to a writable MariaDB", n)
	}
	if idle := db.Stats().Idle; idle != 2 {
		t.Fatalf("%d connections idle after the sweep, want 2", idle)
	}
}
