//go:build !linux

package main

import "syscall"

// childAttr is Linux's parent-death signal elsewhere: none. A child of a
// killed verify or bench goes on until it is stopped by hand.
func childAttr() *syscall.SysProcAttr { return nil }
