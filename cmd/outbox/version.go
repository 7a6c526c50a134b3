package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version describes the binary: the module's version (or "(devel)" when
// built from a checkout), the commit it was built from when known, and Go's.
func version() string {
	v, rev, dirty := "(unknown)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := "outbox " + v
	if rev != "" {
		out += " commit " + rev[:min(12, len(rev))]
		if dirty {
			out += "+dirty"
		}
	}
	return out + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

func cmdVersion(_ context.Context, x *cli, args []string) error {
	if len(args) > 0 && args[0] != "-h" && args[0] != "--help" {
		fmt.Fprintf(x.stderr, "outbox version: unexpected argument %q: it takes none\n", args[0])
		return errUsage
	}
	_, err := fmt.Fprintln(x.stdout, version())
	return err
}
