package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// faultEvent is one fault verify injected: which, when (seconds into the
// run) and how many messages were in flight then, claimed by a relay and
// not yet settled (published, failed or released), over all the relays;
// nil when the count could not be read. A fault that found none in flight
// could not cost a duplicate.
type faultEvent struct {
	Fault    string  `json:"fault"`
	At       float64 `json:"at_seconds"`
	InFlight *int64  `json:"in_flight"`
	// Ended is how many database sessions (terminate-db) or broker
	// connections (close-broker) the fault ended; nil for other faults,
	// and when it failed (said on stderr).
	Ended *int64 `json:"ended,omitempty"`
}

// inFlight counts the messages claimed and not yet settled, nil when the
// table could not be read.
func (v *verifier) inFlight(ctx context.Context) *int64 {
	st, err := v.store.Stats(ctx)
	if err != nil {
		return nil
	}
	return &st.InFlight
}

// inject applies one fault to a relay chosen at random, and records it
// with the messages in flight at that moment.
func (v *verifier) inject(ctx context.Context, relays *relayGroup, fault string) {
	ev := faultEvent{Fault: fault}
	if fault == "kill" {
		// Mid-batch, as far as can be told from outside: while the table
		// shows claimed messages not yet published (a relay holds them).
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if ev.InFlight = v.inFlight(ctx); ev.InFlight == nil || *ev.InFlight > 0 {
				break
			}
		}
	} else {
		ev.InFlight = v.inFlight(ctx)
	}
	ev.At = math.Round(time.Since(v.started).Seconds()*10) / 10
	defer func() {
		v.mu.Lock()
		v.faults[fault]++
		v.faultLog = append(v.faultLog, ev)
		v.mu.Unlock()
	}()
	switch fault {
	case "kill":
		relays.signal(syscall.SIGKILL)
	case "cut-db":
		v.dbProxy.Cut()
	case "cut-broker":
		v.amqpProxy.Cut()
	case "terminate-db":
		var n int64
		if err := v.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
			v.relayName()).Scan(&n); err != nil {
			fmt.Fprintf(v.c.stderr, "verify: terminate-db: %v\n", err)
		} else {
			ev.Ended = &n
		}
	case "close-broker":
		// rabbitmqctl starts an Erlang node: this takes a second or
		// more, by which the next fault comes later.
		if n, err := closeNamedConnections(ctx, v.relayName()); err != nil {
			fmt.Fprintf(v.c.stderr, "verify: close-broker: %v\n", err)
		} else {
			ev.Ended = &n
		}
	case "stall":
		if p := relays.signal(syscall.SIGSTOP); p != nil {
			go func() {
				t := time.NewTimer(v.o.lease + time.Second)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
				}
				_ = p.Signal(syscall.SIGCONT)
			}()
		}
	}
}

// relayGroup runs relays as child processes and restarts those that die
// until stop.
type relayGroup struct {
	mu      sync.Mutex
	procs   []*os.Process
	stopped bool
	wg      sync.WaitGroup
}

func (v *verifier) startRelays(ctx context.Context, dbURL, amqpURL string) (*relayGroup, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"relay", "--table", v.table, "--lease", v.o.lease.String(), "--poll-interval", "50ms", "--shutdown-timeout", "2s",
		"--connection-name", v.relayName()}
	if v.o.ordered {
		args = append(args, "--ordered")
	}
	g := &relayGroup{procs: make([]*os.Process, v.o.relays)}
	for i := range v.o.relays {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for {
				cmd := exec.Command(exe, args...)
				cmd.SysProcAttr = childAttr()
				cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "AMQP_URL="+amqpURL)
				g.mu.Lock()
				if g.stopped {
					g.mu.Unlock()
					return
				}
				err := cmd.Start()
				if err == nil {
					g.procs[i] = cmd.Process
				}
				g.mu.Unlock()
				if err != nil {
					fmt.Fprintf(v.c.stderr, "verify: starting a relay: %v\n", err)
					return
				}
				_ = cmd.Wait()
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond): // a killed relay comes back, as a supervisor would bring it
				}
			}
		}()
	}
	return g, nil
}

// signal sends sig to a running relay chosen at random and returns it.
func (g *relayGroup) signal(sig os.Signal) *os.Process {
	g.mu.Lock()
	defer g.mu.Unlock()
	var live []*os.Process
	for _, p := range g.procs {
		if p != nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}
	p := live[mrand.IntN(len(live))]
	_ = p.Signal(sig)
	return p
}

// stop ends every relay with SIGTERM (after SIGCONT, for a stalled one)
// and waits.
func (g *relayGroup) stop() {
	g.mu.Lock()
	g.stopped = true
	for _, p := range g.procs {
		if p != nil {
			_ = p.Signal(syscall.SIGCONT)
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// relayName names the run's relays: their broker connections and their
// database sessions (application_name), for the faults that end them.
func (v *verifier) relayName() string { return "outbox-verify-relay-" + v.table }

// rabbitmqctl returns the command that runs rabbitmqctl: the one in
// OUTBOX_RABBITMQCTL (words, such as "docker compose exec -T rabbitmq
// rabbitmqctl"), or rabbitmqctl on the PATH.
func rabbitmqctl(args ...string) (*exec.Cmd, error) {
	if prefix := strings.Fields(os.Getenv("OUTBOX_RABBITMQCTL")); len(prefix) > 0 {
		return exec.Command(prefix[0], append(prefix[1:], args...)...), nil
	}
	path, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		return nil, errors.New("no rabbitmqctl on the PATH (set OUTBOX_RABBITMQCTL to the command that runs it)")
	}
	return exec.Command(path, args...), nil
}

// closeNamedConnections has the broker close every connection named name,
// as rabbitmqctl close_connection does (320 CONNECTION_FORCED), in one
// rabbitmqctl call, and returns how many it closed.
func closeNamedConnections(ctx context.Context, name string) (int64, error) {
	lit := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(name)
	cmd, err := rabbitmqctl("eval", `Pids = [Pid || Pid <- rabbit_networking:connections(),
	{<<"connection_name">>, _, N} <- case catch rabbit_reader:info(Pid, [client_properties]) of
		[{client_properties, Props}] when is_list(Props) -> Props; _ -> [] end,
	N =:= <<"`+lit+`">>],
[catch rabbit_networking:close_connection(Pid, "closed by outbox verify") || Pid <- Pids],
length(Pids).`)
	if err != nil {
		return 0, err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl eval: %v: %s", err, strings.TrimSpace(string(out)))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl eval printed %q", out)
	}
	return n, ctx.Err()
}
