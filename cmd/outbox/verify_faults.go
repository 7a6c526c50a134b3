package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
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
	// Duplicates is how many duplicates were put down to it (see
	// dupReport).
	Duplicates int `json:"duplicates"`

	when, ended time.Time // when it began and when it was over, to put duplicates down to it
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
// with the messages in flight at that moment. Faults run in goroutines of
// their own, on schedule, so that one that takes long (rabbitmqctl, an
// outage) does not put off the next: they may overlap.
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
	// A signal or a cut takes effect at once; a command (rabbitmqctl
	// starts an Erlang node, a second or more, then closes the
	// connections; stop_app takes seconds more) somewhere between when it
	// began and when it returned: see dupsBy.
	ev.when = time.Now()
	defer func() {
		ev.ended = time.Now()
		ev.At = math.Round(ev.when.Sub(v.started).Seconds()*10) / 10
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
		if n, err := v.terminateRelaySessions(ctx); err != nil {
			fmt.Fprintf(v.c.stderr, "verify: terminate-db: %v\n", err)
		} else {
			ev.Ended = &n
		}
	case "close-broker":
		if n, err := closeNamedConnections(ctx, v.relayName()); err != nil {
			fmt.Fprintf(v.c.stderr, "verify: close-broker: %v\n", err)
		} else {
			ev.Ended = &n
		}
	case "broker-outage":
		if err := brokerOutage(ctx, v.o.outage); err != nil {
			fmt.Fprintf(v.c.stderr, "verify: broker-outage: %v\n", err)
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

// terminateRelaySessions ends every database session of the relays and
// returns how many it ended: on PostgreSQL with pg_terminate_backend, by
// their application_name; on MySQL with KILL CONNECTION, by the client
// ports of verify's proxy.
func (v *verifier) terminateRelaySessions(ctx context.Context) (int64, error) {
	var n int64
	if !v.sql.mysql {
		err := v.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
			v.relayName()).Scan(&n)
		return n, err
	}
	ports := v.dbProxy.LocalPorts()
	if len(ports) == 0 {
		return 0, nil
	}
	query, args := v.sql.sessionsOf(ports)
	rows, err := v.db.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, id := range ids {
		// A session that ended meanwhile is not an error (1094: unknown
		// thread id).
		if _, err := v.db.ExecContext(ctx, "KILL CONNECTION ?", id); err == nil {
			n++
		}
	}
	return n, nil
}

// restartAfter is how soon a relay that died is started again.
const restartAfter = 200 * time.Millisecond

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
	if v.o.batchSize > 0 {
		args = append(args, "--batch-size", strconv.Itoa(v.o.batchSize))
	}
	if v.o.publishTimeout > 0 {
		args = append(args, "--publish-timeout", v.o.publishTimeout.String())
	}
	if v.o.relayLogs != "" {
		if err := os.MkdirAll(v.o.relayLogs, 0o755); err != nil {
			return nil, err
		}
		args = append(args, "--debug")
	}
	logs := make([]*os.File, v.o.relays) // one per relay, across its restarts
	if v.o.relayLogs != "" {
		for i := range logs {
			if logs[i], err = os.OpenFile(filepath.Join(v.o.relayLogs, fmt.Sprintf("relay-%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
				for _, f := range logs[:i] {
					f.Close()
				}
				return nil, err
			}
		}
	}
	g := &relayGroup{procs: make([]*os.Process, v.o.relays)}
	for i, logFile := range logs {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if logFile != nil {
				defer logFile.Close()
			}
			for {
				cmd := exec.Command(exe, args...)
				cmd.SysProcAttr = childAttr()
				cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "AMQP_URL="+amqpURL)
				g.mu.Lock()
				if g.stopped {
					g.mu.Unlock()
					return
				}
				if logFile != nil {
					fmt.Fprintf(logFile, "time=%s verify: starting relay %d\n", time.Now().Format(time.RFC3339Nano), i)
					cmd.Stderr = logFile
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
				case <-time.After(restartAfter): // a killed relay comes back, as a supervisor would bring it
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

// brokerOutage stops RabbitMQ's application (its node stays up, every
// connection is closed and no new one is accepted), waits d and starts it
// again; it starts it again even when ctx ends meanwhile.
func brokerOutage(ctx context.Context, d time.Duration) error {
	run := func(args ...string) error {
		cmd, err := rabbitmqctl(args...)
		if err != nil {
			return err
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := run("stop_app"); err != nil {
		_ = run("start_app")
		return err
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	return run("start_app")
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
