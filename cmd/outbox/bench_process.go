package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/syncbuf"
	"github.com/acemq/outbox/relay"
)

// startRelayProcess runs `outbox relay` on the bench's table as a child
// process of this binary, with the relay's defaults (batch size and
// in-flight as the bench's flags say), until the returned function stops it
// with SIGTERM, as a service manager would, and reads its totals.
func (b *bencher) startRelayProcess(st *outbox.Store) (func() relay.Stats, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"relay", "--table", b.table, "--batch-size", strconv.Itoa(b.o.batch), "--max-in-flight", strconv.Itoa(b.o.inFlight)}
	if st.Ordering() == outbox.OrderedByKey {
		args = append(args, "--ordered")
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = childAttr()
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.o.databaseURL, "AMQP_URL="+strings.Join(b.urls, ","))
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.phases = nil // measured in the other process
	b.relayPID = cmd.Process.Pid
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "relay: Started"); {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("the relay process did not start within 30s:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return func() relay.Stats {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			fmt.Fprintf(b.stderr, "bench: the relay process: %v\n%s", err, stderr.String())
		}
		b.relayPID = 0
		var st relay.Stats
		_, _ = fmt.Sscanf(stdout.String(), "relay stopped: %d published, %d failed, %d released, %d leases lost",
			&st.Published, &st.Failed, &st.Released, &st.LeasesLost)
		return st
	}, nil
}

// holdSnapshot opens a REPEATABLE READ transaction on a connection of its
// own and takes its snapshot, which holds VACUUM back until release.
func holdSnapshot(ctx context.Context, db *sql.DB, mysql bool) (release func(), err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if mysql { // InnoDB takes a read view at the first read of a table, or here
		if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
			conn.Close()
			return nil, err
		}
		return func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); conn.Close() }, nil
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		conn.Close()
		return nil, err
	}
	var x int
	if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&x); err != nil { // the snapshot is taken here
		_ = tx.Rollback()
		conn.Close()
		return nil, err
	}
	return func() { _ = tx.Rollback(); conn.Close() }, nil
}

// deadTuples returns PostgreSQL's count of the table's dead row versions
// (its statistics lag behind by up to a second or so).
// In the log layout, the events table's are those of its partitions.
func (b *bencher) deadTuples(ctx context.Context) int64 {
	var n int64
	if b.mysql { // InnoDB's: the undo records not purged yet, the whole server's
		_ = b.db.QueryRowContext(ctx, `SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'`).Scan(&n)
		return n
	}
	_ = b.db.QueryRowContext(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
WHERE relid = to_regclass($1) OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1))`, b.table).Scan(&n)
	return n
}

// walFlushes returns how many times the server has flushed its WAL
// (pg_stat_wal.wal_sync, the whole server's, PostgreSQL 14 and later), or
// -1 when it cannot tell.
func (b *bencher) walFlushes(ctx context.Context) int64 {
	var n int64
	if b.mysql {
		return -1
	}
	if err := b.db.QueryRowContext(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// walText says how many WAL flushes the last relay run cost the server,
// when it could tell.
func (b *bencher) walText() string {
	if b.walDuring < 0 {
		return ""
	}
	return fmt.Sprintf("; the server flushed its WAL %d times while the relay ran", b.walDuring)
}

// deadText says what row versions the last run left behind: PostgreSQL's
// dead ones in the table, or InnoDB's history list (the server's undo
// records not purged yet) before and after it.
func (b *bencher) deadText() string {
	if b.mysql {
		return fmt.Sprintf("InnoDB history list length %d before the run, %d after", b.deadBefore, b.deadAfter)
	}
	return fmt.Sprintf("%d dead row versions left by the run", b.deadAfter-b.deadBefore)
}

// bookkeeping describes, in the log layout, the rows and dead row versions
// of the tables beside the events one; "" in the rows layout.
func (b *bencher) bookkeeping(ctx context.Context) string {
	if b.o.layout != "log" {
		return ""
	}
	var batches, settles, failed, dead int64
	_, _ = b.db.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`)
	err := b.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM "%[1]s_batch"), (SELECT count(*) FROM "%[1]s_settle"), (SELECT count(*) FROM "%[1]s_failed"),
	(SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid = to_regclass('"%[1]s_failed"')
	   OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent IN (to_regclass('"%[1]s_batch"'), to_regclass('"%[1]s_settle"'))))`, b.table)).
		Scan(&batches, &settles, &failed, &dead)
	if err != nil {
		return ""
	}
	exact := ""
	var stt sql.NullInt64 // pgstattuple, when installed, reads the pages themselves
	if b.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT sum((pgstattuple(inhrelid)).dead_tuple_count) FROM pg_inherits WHERE inhparent = to_regclass('"%s"')
	AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple')`, b.table)).Scan(&stt) == nil && stt.Valid {
		exact = fmt.Sprintf(", %d by pgstattuple", stt.Int64)
	}
	return fmt.Sprintf(" (in the events table%s); bookkeeping: %d batch rows, %d settle rows, %d failed rows, %d dead row versions", exact, batches, settles, failed, dead)
}

// truncateSQL empties the scratch table before a run: in the log layout,
// with its bookkeeping.
func (b *bencher) truncateSQL() string {
	if b.mysql {
		return "TRUNCATE TABLE `" + b.table + "`"
	}
	if b.o.layout == "log" {
		return fmt.Sprintf(`TRUNCATE "%[1]s", "%[1]s_batch", "%[1]s_settle", "%[1]s_failed"`, b.table)
	}
	return `TRUNCATE "` + b.table + `"`
}

// dropScratch drops the scratch table of either layout.
func dropScratch(table string) string {
	return fmt.Sprintf(`DROP VIEW IF EXISTS "%[1]s_messages"; DROP FUNCTION IF EXISTS "%[1]s_claim"; DROP TABLE IF EXISTS "%[1]s", "%[1]s_batch", "%[1]s_settle", "%[1]s_failed", "%[1]s_log", "%[1]s_scheduled"; DROP FUNCTION IF EXISTS "%[1]s_id_check"`, table)
}
