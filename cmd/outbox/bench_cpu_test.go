package main

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestProcTimesParsesStat: a process name may hold spaces and parentheses;
// the times after it are read from the right fields, in seconds.
func TestProcTimesParsesStat(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
	stat := "42 (post gres) (x)) S 1 42 42 0 -1 4194304 10 0 0 0 250 50 700 100 20 0 1 0 5 0 0\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o600); err != nil {
		t.Fatal(err)
	}
	comm, own, children, ok := procTimes(dir)
	if !ok || comm != "post gres) (x)" || own != 3 || children != 8 {
		t.Fatalf("procTimes = %q, %v, %v, %v; want \"post gres) (x)\", 3, 8, true", comm, own, children, ok)
	}
	if _, _, _, ok := procTimes(filepath.Join(dir, "gone")); ok {
		t.Fatal("a process that ended was read")
	}
}

// TestReadCPUSeesThisProcess: CPU this process burns shows in its own
// figure and in the machine's busy time.
func TestReadCPUSeesThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	before := readCPU(0)
	if !before.ok {
		t.Fatal("readCPU could not read /proc")
	}
	deadline := time.Now().Add(30 * time.Second)
	for x := 0; ; x++ {
		if x%1_000_000 == 0 {
			if used := readCPU(0).sub(before); used.bench >= 0.05 && used.busy >= 0.05 {
				c := used.per(1000)
				if !c.ok || c.bench < 50 || c.idle < 0 || c.idle > 1 {
					t.Fatalf("per 1,000 messages: %+v", c)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("burned CPU for 30s and saw %+v", readCPU(0).sub(before))
			}
		}
	}
}

// TestCPUTextNamesServersElsewhere: a server whose processes are not on
// this machine is said to be elsewhere, not to cost nothing.
func TestCPUTextNamesServersElsewhere(t *testing.T) {
	t.Parallel()
	here := cpuCost{rabbit: 53.4, postgres: 14.6, bench: 21, relay: 14, idle: 0.12, ok: true, sawRabbit: true, sawPostgres: true}
	if got, want := here.text(true), "RabbitMQ 53, PostgreSQL 15, the relay's process 14, the bench 21, the rest 0 ms per 1,000 messages; machine 12% idle"; got != want {
		t.Fatalf("text = %q, want %q", got, want)
	}
	remote := here
	remote.sawRabbit = false
	if got, want := remote.text(false), "RabbitMQ not on this machine, PostgreSQL 15, the bench 21, the rest 0 ms per 1,000 messages; machine 12% idle"; got != want {
		t.Fatalf("text = %q, want %q", got, want)
	}
	if got := (costs{remote, here}).median(); !got.sawRabbit || !got.sawPostgres {
		t.Fatalf("median lost where the servers are: %+v", got)
	}
	if got := (cpuCost{}).text(false); got != "unknown (no /proc)" {
		t.Fatalf("text of nothing = %q", got)
	}
}
