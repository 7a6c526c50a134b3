package main

import (
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
	cmd.Env = append(os.Environ(), "DATABASE_URL="+b.o.databaseURL, "AMQP_URL="+strings.Join(b.urls, ","))
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.phases = nil // measured in the other process
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
		var st relay.Stats
		_, _ = fmt.Sscanf(stdout.String(), "relay stopped: %d published, %d failed, %d released, %d leases lost",
			&st.Published, &st.Failed, &st.Released, &st.LeasesLost)
		return st
	}, nil
}
