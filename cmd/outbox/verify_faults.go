package main

import (
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
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
	v.mu.Lock()
	v.faults[fault]++
	v.faultLog = append(v.faultLog, ev)
	v.mu.Unlock()
	switch fault {
	case "kill":
		relays.signal(syscall.SIGKILL)
	case "cut-db":
		v.dbProxy.Cut()
	case "cut-broker":
		v.amqpProxy.Cut()
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
	args := []string{"relay", "--table", v.table, "--lease", v.o.lease.String(), "--poll-interval", "50ms", "--shutdown-timeout", "2s"}
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
