package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// childrenOf returns the processes whose parent is pid, from /proc.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// alive says whether process pid runs (a zombie, ended and not yet
// reaped by whoever adopted it, does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

var scratchLine = regexp.MustCompile(`verify: scratch table (outbox_verify_[0-9a-f]{8}),`)

// verifyRun is a run of the built binary's verify, with its stderr.
type verifyRun struct {
	cmd    *exec.Cmd
	stderr *dbtest.Buffer
	table  string
}

// startVerify starts verify and waits until its relays run and it has
// reported progress once.
func startVerify(t *testing.T, bin string, relays int) *verifyRun {
	t.Helper()
	cmd := exec.Command(bin, "verify", "--duration", "2m", "--rate", "20", "--faults", "none", "--relays", strconv.Itoa(relays), "--keys", "5")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL())
	r := &verifyRun{cmd: cmd, stderr: &dbtest.Buffer{}}
	cmd.Stderr = r.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		return regexp.MustCompile(`verify:\s+\d+s  written [1-9]`).MatchString(r.stderr.String()) && len(childrenOf(t, cmd.Process.Pid)) == relays
	}, 60*time.Second, 20*time.Millisecond, "verify started its relays and writes: %s", r.stderr)
	m := scratchLine.FindStringSubmatch(r.stderr.String())
	require.NotNil(t, m, r.stderr.String())
	r.table = m[1]
	return r
}

// queueExists says whether the broker has the queue.
func queueExists(t *testing.T, conn *amqp.Connection, name string) bool {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close() //nolint:errcheck // closed by the broker when the queue is missing
	_, err = ch.QueueDeclarePassive(name, false, false, false, false, nil)
	return err == nil
}

func tablesOf(t *testing.T, table string) int64 {
	t.Helper()
	return dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM pg_tables WHERE tablename = $1 OR tablename LIKE $1 || '\_%'`, table)
}

// Issue 47, item 9: a killed verify left its relays running and its
// scratch tables and queues behind. Its relays now die with it (SIGKILL
// from the kernel when it ends), a broken pipe ends it as an interrupt
// would (it cleaned up nothing, killed by SIGPIPE), and the next run
// removes what a killed run left, once its heartbeat is stale, and not
// what a live run uses.
func TestKilledVerifyLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "outbox")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	db := dbtest.DB(t)
	conn := amqptest.Conn(t)

	// SIGKILL: no handler runs, the relays die with verify.
	killed := startVerify(t, bin, 2)
	relays := childrenOf(t, killed.cmd.Process.Pid)
	require.NoError(t, killed.cmd.Process.Kill())
	_ = killed.cmd.Wait()
	require.Eventually(t, func() bool {
		for _, p := range relays {
			if alive(p) {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the relays %v died with verify", relays)
	require.Positive(t, tablesOf(t, killed.table), "a SIGKILL leaves the tables")
	// Kept from the runs below until the test makes it stale (as --keep
	// keeps a run's objects), however long they take to start.
	_, err = db.Exec(`UPDATE "` + killed.table + `_alive" SET at = 'infinity'`)
	require.NoError(t, err)
	require.True(t, queueExists(t, conn, "outbox.verify."+strings.TrimPrefix(killed.table, "outbox_verify_")), "and the queue")

	// A broken pipe (`outbox verify 2>&1 | head`): verify ends and cleans up.
	cmd := exec.Command(bin, "verify", "--duration", "2m", "--rate", "20", "--faults", "none", "--relays", "1", "--keys", "5")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL())
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var piped string
	lines := bufio.NewScanner(pipe)
	for lines.Scan() {
		if m := scratchLine.FindStringSubmatch(lines.Text()); m != nil {
			piped = m[1]
		}
		if strings.Contains(lines.Text(), "written") {
			break
		}
	}
	require.NotEmpty(t, piped)
	pipedRelays := childrenOf(t, cmd.Process.Pid)
	require.Len(t, pipedRelays, 1)
	require.NoError(t, pipe.Close()) // as head does after its lines
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			ws := ee.Sys().(syscall.WaitStatus)
			require.False(t, ws.Signaled(), "verify ended by itself, not killed by %v", ws.Signal())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("verify did not end within 30s of its stderr's reader going away")
	}
	require.Zero(t, tablesOf(t, piped), "it dropped its tables")
	require.False(t, queueExists(t, conn, "outbox.verify."+strings.TrimPrefix(piped, "outbox_verify_")), "and deleted its queue")
	require.False(t, alive(pipedRelays[0]), "and stopped its relay")

	// The next run removes the killed run's leftovers once its heartbeat
	// is stale (here: made so, as if 15 s had passed), and leaves a live
	// run's alone.
	live := startVerify(t, bin, 1)
	_, err = db.Exec(`UPDATE "` + killed.table + `_alive" SET at = now() - interval '1 hour'`)
	require.NoError(t, err)
	next := exec.Command(bin, "verify", "--duration", "1s", "--rate", "20", "--faults", "none", "--relays", "1", "--keys", "5", "--drain-timeout", "30s")
	next.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "AMQP_URL="+amqptest.URL())
	var nextErr dbtest.Buffer
	next.Stderr = &nextErr
	_, err = next.Output()
	require.NoError(t, err, nextErr.String())
	require.Regexp(t, `verify: removed what \d+ earlier run\(s\) left behind, killed before they could: .*`+killed.table, nextErr.String())
	require.NotContains(t, nextErr.String(), live.table)
	require.Zero(t, tablesOf(t, killed.table), "the killed run's tables are gone")
	require.False(t, queueExists(t, conn, "outbox.verify."+strings.TrimPrefix(killed.table, "outbox_verify_")), "and its queue")
	require.Positive(t, tablesOf(t, live.table), "the live run's are there")
	require.True(t, queueExists(t, conn, "outbox.verify."+strings.TrimPrefix(live.table, "outbox_verify_")))

	require.NoError(t, live.cmd.Process.Signal(syscall.SIGTERM))
	_ = live.cmd.Wait()
	require.Zero(t, tablesOf(t, live.table), "interrupted, it cleaned up")
}
