package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cpuUse is the CPU time, in seconds, that the parts behind a throughput
// figure have used so far, read from Linux's /proc when the servers run on
// this machine: RabbitMQ (its beam.smp), PostgreSQL (every postgres
// process, with the backends that have ended), this process, the relay's
// process, and the machine's busy and idle time. ok is false where /proc
// cannot tell (not Linux).
type cpuUse struct {
	rabbit, postgres, bench, relay, busy, idle float64
	ok                                         bool
	sawRabbit, sawPostgres                     bool // their processes are on this machine
}

// userHZ is the unit of /proc's CPU times: Linux reports them in 1/100 s
// on every architecture.
const userHZ = 100

// readCPU reads the CPU time used so far; relayPID is the relay's process,
// 0 when the relay runs in this one.
func readCPU(relayPID int) cpuUse {
	var u cpuUse
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return u
	}
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line)) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return u
	}
	for i, v := range f[1:9] {
		n, _ := strconv.ParseFloat(v, 64)
		if i == 3 || i == 4 { // idle, iowait
			u.idle += n / userHZ
		} else {
			u.busy += n / userHZ
		}
	}
	self := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, own, children, ok := procTimes(d)
		if !ok {
			continue // it ended meanwhile
		}
		switch {
		case pid == self:
			u.bench += own
		case pid == relayPID:
			u.relay += own
		case comm == "postgres":
			// The postmaster's children's times hold the backends that
			// ended (and were reaped) since the last reading.
			u.postgres += own + children
			u.sawPostgres = true
		case comm == "beam.smp":
			u.rabbit += own
			u.sawRabbit = true
		}
	}
	u.ok = true
	return u
}

// procTimes reads the name of process dir and the CPU time it and its ended
// children used, in seconds.
func procTimes(dir string) (comm string, own, children float64, ok bool) {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return "", 0, 0, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	f := strings.Fields(string(b[end+1:])) // from field 3, state
	if len(f) < 15 {
		return "", 0, 0, false
	}
	t := func(i int) float64 { n, _ := strconv.ParseFloat(f[i-3], 64); return n / userHZ }
	return string(b[open+1 : end]), t(14) + t(15), t(16) + t(17), true
}

// sub returns what was used between b and u.
func (u cpuUse) sub(b cpuUse) cpuUse {
	return cpuUse{rabbit: u.rabbit - b.rabbit, postgres: u.postgres - b.postgres, bench: u.bench - b.bench, relay: u.relay - b.relay,
		busy: u.busy - b.busy, idle: u.idle - b.idle, ok: u.ok && b.ok,
		sawRabbit: u.sawRabbit && b.sawRabbit, sawPostgres: u.sawPostgres && b.sawPostgres}
}

// cpuCost is the CPU a phase used per 1,000 messages, by part, and the
// share of the machine left idle.
type cpuCost struct {
	rabbit, postgres, bench, relay, rest float64 // milliseconds per 1,000 messages
	idle                                 float64 // share of the machine's time, 0-1
	ok                                   bool
	sawRabbit, sawPostgres               bool // their processes are on this machine
}

func (u cpuUse) per(messages int) cpuCost {
	if !u.ok || messages <= 0 || u.busy+u.idle <= 0 {
		return cpuCost{}
	}
	k := 1e6 / float64(messages) // seconds per message → ms per 1,000
	return cpuCost{rabbit: u.rabbit * k, postgres: u.postgres * k, bench: u.bench * k, relay: u.relay * k,
		rest: max(u.busy-u.rabbit-u.postgres-u.bench-u.relay, 0) * k, idle: u.idle / (u.busy + u.idle), ok: true,
		sawRabbit: u.sawRabbit, sawPostgres: u.sawPostgres}
}

// text says where a phase's CPU went; relayProcess says whether the
// relay had a process of its own (else it is in the bench's figure).
func (c cpuCost) text(relayProcess bool) string {
	if !c.ok {
		return "unknown (no /proc)"
	}
	server := func(name string, ms float64, here bool) string {
		if !here {
			return name + " not on this machine"
		}
		return fmt.Sprintf("%s %.0f", name, ms)
	}
	relay := ""
	if relayProcess {
		relay = fmt.Sprintf(", the relay's process %.0f", c.relay)
	}
	return fmt.Sprintf("%s, %s%s, the bench %.0f, the rest %.0f ms per 1,000 messages; machine %.0f%% idle",
		server("RabbitMQ", c.rabbit, c.sawRabbit), server("PostgreSQL", c.postgres, c.sawPostgres), relay, c.bench, c.rest, 100*c.idle)
}

// costs is one cpuCost per run.
type costs []cpuCost

// median returns the part-by-part medians of the runs.
func (cs costs) median() cpuCost {
	m := cpuCost{ok: slices.ContainsFunc(cs, func(c cpuCost) bool { return c.ok })}
	if !m.ok {
		return m
	}
	pick := func(get func(cpuCost) float64) float64 {
		var f figure
		for _, c := range cs {
			if c.ok {
				f = append(f, get(c))
			}
		}
		return f.median()
	}
	m.rabbit = pick(func(c cpuCost) float64 { return c.rabbit })
	m.postgres = pick(func(c cpuCost) float64 { return c.postgres })
	m.bench = pick(func(c cpuCost) float64 { return c.bench })
	m.relay = pick(func(c cpuCost) float64 { return c.relay })
	m.rest = pick(func(c cpuCost) float64 { return c.rest })
	m.idle = pick(func(c cpuCost) float64 { return c.idle })
	for _, c := range cs {
		m.sawRabbit = m.sawRabbit || c.sawRabbit
		m.sawPostgres = m.sawPostgres || c.sawPostgres
	}
	return m
}
