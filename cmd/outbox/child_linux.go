//go:build linux

package main

import "syscall"

// childAttr makes a child process (a relay of verify or bench) die with
// this one: the kernel sends it SIGKILL when this process ends, however
// it ends (a SIGKILL of verify, which no handler sees), so that no relay
// is left running on a scratch table.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
