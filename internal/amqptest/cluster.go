package amqptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Cluster is a throwaway 3-node RabbitMQ cluster on 127.0.0.1:5673-5675,
// started beside the machine's own broker by testdata/cluster.sh. It needs
// root (the nodes run as the rabbitmq user) and about 30 seconds to start,
// so tests that use it run only when OUTBOX_CLUSTER_TEST=1.
type Cluster struct {
	tb     testing.TB
	dir    string
	script string
	// URLs of the nodes c1, c2 and c3, in that order.
	URLs []string
}

// StartCluster starts the cluster and stops it when the test ends, or
// skips the test unless OUTBOX_CLUSTER_TEST=1.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Getenv("OUTBOX_CLUSTER_TEST") != "1" {
		tb.Skip("set OUTBOX_CLUSTER_TEST=1 to run the RabbitMQ cluster tests (root, ~1 minute)")
	}
	_, self, _, _ := runtime.Caller(0)
	c := &Cluster{tb: tb, script: filepath.Join(filepath.Dir(self), "testdata", "cluster.sh"),
		URLs: []string{"amqp://guest:guest@127.0.0.1:5673/", "amqp://guest:guest@127.0.0.1:5674/", "amqp://guest:guest@127.0.0.1:5675/"}}
	dir, err := os.MkdirTemp("", "outbox-cluster-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the nodes run as the rabbitmq user
		tb.Fatal(err)
	}
	c.dir = dir
	tb.Cleanup(func() { _ = exec.Command(c.script, "stop", c.dir).Run() })
	if out, err := exec.Command(c.script, "start", c.dir).CombinedOutput(); err != nil {
		tb.Fatalf("amqptest: starting the cluster: %v: %s", err, out)
	}
	return c
}

// Ctl runs rabbitmqctl against the cluster's node n (1-3).
func (c *Cluster) Ctl(n int, args ...string) string {
	c.tb.Helper()
	out, err := exec.Command(c.script, append([]string{"ctl", c.dir, "-n", node(n)}, args...)...).CombinedOutput()
	if err != nil {
		c.tb.Fatalf("amqptest: rabbitmqctl -n %s %s: %v: %s", node(n), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// QueueLeader returns the number (1-3) of the node that leads a quorum queue.
func (c *Cluster) QueueLeader(queue string) int {
	c.tb.Helper()
	for _, line := range strings.Split(c.Ctl(1, "list_queues", "-q", "--no-table-headers", "name", "leader"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			for n := 1; n <= 3; n++ {
				if f[1] == node(n) {
					return n
				}
			}
		}
	}
	c.tb.Fatalf("amqptest: no leader found for queue %s", queue)
	return 0
}

// Kill kills node n's Erlang VM with SIGKILL, as a crashed machine would.
func (c *Cluster) Kill(n int) {
	c.tb.Helper()
	pid, err := os.ReadFile(filepath.Join(c.dir, "c"+string(rune('0'+n)), "pid"))
	if err != nil {
		c.tb.Fatal(err)
	}
	if out, err := exec.Command("kill", "-9", strings.TrimSpace(string(pid))).CombinedOutput(); err != nil {
		c.tb.Fatalf("amqptest: kill -9 %s: %v: %s", pid, err, out)
	}
}

func node(n int) string { return "c" + string(rune('0'+n)) + "@localhost" }
