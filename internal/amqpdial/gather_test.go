package amqpdial

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// recorder is a socket that records each write.
type recorder struct {
	net.Conn
	writes [][]byte
	fail   error // returned by writes from now on
	closed bool
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.fail != nil {
		return 0, r.fail
	}
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func (r *recorder) Close() error { r.closed = true; return nil }

// TestGatherWritesAWindowTogether: writes pass through until Hold; then
// they wait for Flush and go out as one write, in order.
func TestGatherWritesAWindowTogether(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	g := &Gather{Conn: r}
	if n, err := g.Write([]byte("a")); n != 1 || err != nil || len(r.writes) != 1 {
		t.Fatalf("unheld write: %d, %v, %d writes", n, err, len(r.writes))
	}
	g.Hold()
	for _, s := range []string{"b", "cd", "e"} {
		if n, err := g.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("held write %q: %d, %v", s, n, err)
		}
	}
	if len(r.writes) != 1 {
		t.Fatalf("held writes reached the socket: %q", r.writes)
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(r.writes) != 2 || string(r.writes[1]) != "bcde" {
		t.Fatalf("after Flush: %q, want [a bcde]", r.writes)
	}
	if err := g.Flush(); err != nil || len(r.writes) != 2 {
		t.Fatalf("an empty Flush wrote: %v, %q", err, r.writes)
	}
	g.Write([]byte("f")) //nolint:errcheck // checked through the recorder
	if len(r.writes) != 3 {
		t.Fatal("a write after Flush waited")
	}
}

// TestGatherWritesWhenFull: a window past gatherMax is written as it
// fills, not held whole.
func TestGatherWritesWhenFull(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	g := &Gather{Conn: r}
	g.Hold()
	chunk := make([]byte, gatherMax/2+1)
	g.Write(chunk) //nolint:errcheck
	if len(r.writes) != 0 {
		t.Fatal("wrote before gatherMax")
	}
	g.Write(chunk) //nolint:errcheck
	if len(r.writes) != 1 || len(r.writes[0]) != 2*len(chunk) {
		t.Fatalf("past gatherMax: %d writes", len(r.writes))
	}
	g.Write([]byte("x")) //nolint:errcheck // still held
	if len(r.writes) != 1 {
		t.Fatal("the hold ended at gatherMax")
	}
	if err := g.Flush(); err != nil || len(r.writes) != 2 {
		t.Fatalf("Flush: %v, %d writes", err, len(r.writes))
	}
}

// TestGatherFailureClosesTheSocket: a failed write closes the socket, and
// every write and Flush after it fails; nothing gathered is written.
func TestGatherFailureClosesTheSocket(t *testing.T) {
	t.Parallel()
	broken := errors.New("connection reset by peer")
	r := &recorder{}
	g := &Gather{Conn: r}
	g.Hold()
	g.Write([]byte("lost")) //nolint:errcheck
	r.fail = broken
	if err := g.Flush(); !errors.Is(err, broken) {
		t.Fatalf("Flush = %v, want %v", err, broken)
	}
	if !r.closed {
		t.Fatal("the socket was left open")
	}
	r.fail = nil // a socket that would take writes again must not get any
	if _, err := g.Write([]byte("after")); !errors.Is(err, errGatherClosed) {
		t.Fatalf("write after a failure: %v", err)
	}
	g.Hold()
	if err := g.Flush(); !errors.Is(err, errGatherClosed) {
		t.Fatalf("Flush after a failure: %v", err)
	}
	if len(r.writes) != 0 {
		t.Fatalf("wrote after the failure: %q", r.writes)
	}

	var none *Gather // a lane without a Gather
	none.Hold()
	if err := none.Flush(); err != nil {
		t.Fatal(err)
	}
}
