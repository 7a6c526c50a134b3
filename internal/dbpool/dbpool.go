// Package dbpool makes a database/sql pool leave a server that stopped
// accepting writes: an old primary fenced read-only by a failover, a node
// demoted to a replica. Such a server does not close its sessions, and a
// pool keeps handing out the connections it holds to it: every write then
// fails (PostgreSQL's SQLSTATE 25006, MySQL's 1290 or 1792) until the
// connections end. Closing them lets the pool connect again, and a
// multi-host URL with target_session_attrs=read-write (pgx), or a DNS name
// or proxy that moved, finds the writable server.
package dbpool

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"time"

	"github.com/acemq/outbox/internal/dberr"
)

// Query returns the statement that says whether a connection's server
// accepts no writes (true), for PostgreSQL or for MySQL and MariaDB.
func Query(mysql bool) string {
	if mysql {
		return `SELECT @@global.read_only = 1`
	}
	return `SELECT pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on'`
}

// Leaver drops a pool's connections to read-only servers, at most one
// sweep at a time and one every MinInterval.
type Leaver struct {
	running atomic.Bool
	last    atomic.Int64 // unix nanoseconds of the last sweep's start
}

// MinInterval is the least time between two sweeps of one Leaver.
const MinInterval = 250 * time.Millisecond

// sweepTimeout bounds a sweep: the check of every idle connection.
const sweepTimeout = 5 * time.Second

// Leave checks the connections idle in db with query (see Query) and
// closes those whose server accepts no writes, or that fail the check. A
// connection in use is checked by the next sweep, after its next failure.
// It returns how many it closed; 0 without a check when another sweep
// runs or the last began less than MinInterval ago.
func (l *Leaver) Leave(ctx context.Context, db *sql.DB, query string) int {
	now := time.Now().UnixNano()
	if time.Duration(now-l.last.Load()) < MinInterval || !l.running.CompareAndSwap(false, true) {
		return 0
	}
	defer l.running.Store(false)
	l.last.Store(now)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sweepTimeout)
	defer cancel()
	// Every idle connection at once, held until all are checked: the
	// pool hands out its most recently used first, and one returned
	// meanwhile would be checked twice and another not at all.
	n := db.Stats().Idle
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	closed := 0
	for _, c := range conns {
		var readOnly bool
		if err := c.QueryRowContext(ctx, query).Scan(&readOnly); err == nil && !readOnly {
			continue
		}
		// database/sql closes a connection whose Raw function returns
		// driver.ErrBadConn, instead of returning it to the pool.
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
		closed++
	}
	return closed
}

// After is what a store or a consumer calls after a failure err of db:
// when err says that the server accepts no writes, it leaves such servers
// (Leave, with the query for MySQL and MariaDB when mysql) and returns how
// many connections it closed; otherwise it does nothing and returns 0.
func (l *Leaver) After(ctx context.Context, db *sql.DB, mysql bool, err error) int {
	if err == nil || dberr.Classify(err) != dberr.ReadOnly {
		return 0
	}
	return l.Leave(ctx, db, Query(mysql))
}
