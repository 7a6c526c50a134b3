package amqpdial

import (
	"errors"
	"net"
	"sync"
)

// gatherMax is the most a Gather holds: past it, it writes what it holds at
// once (a window of large messages is not kept in memory twice).
const gatherMax = 256 << 10

// errGatherClosed is what a Gather's writes return after one failed.
var errGatherClosed = errors.New("amqpdial: an earlier write failed; the connection is closed")

// Gather is the socket under a connection that DialGather opened: between
// Hold and Flush its writes are gathered and written together, so that a
// window of messages goes out in a few writes rather than one (a system
// call, a TCP segment, a wake-up of the broker's reader) per message, which
// is how amqp091-go writes a publish. Anything else written meanwhile (a
// heartbeat) goes out with them at the Flush.
//
// A write that fails closes the socket, and every write after it fails:
// amqp091-go then sees the connection closed, and the messages whose
// confirms never come are the publisher's broker faults, as when the
// connection drops. Reads, deadlines and Close are the socket's own.
type Gather struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
	err  error
}

// Write writes p, or gathers it while the Gather is held.
func (g *Gather) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	if !g.held {
		return g.write(p)
	}
	g.buf = append(g.buf, p...)
	if len(g.buf) >= gatherMax {
		if err := g.flush(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Hold gathers the writes that follow until Flush. On a nil Gather, Hold
// and Flush do nothing.
func (g *Gather) Hold() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.held = true
	g.mu.Unlock()
}

// Flush writes what was gathered and ends the Hold. It returns the error
// of that write, or of an earlier one.
func (g *Gather) Flush() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = false
	if g.err != nil {
		return g.err
	}
	return g.flush()
}

func (g *Gather) flush() error {
	if len(g.buf) == 0 {
		return nil
	}
	_, err := g.write(g.buf)
	g.buf = g.buf[:0]
	return err
}

// write writes p to the socket; a failure closes it for good.
func (g *Gather) write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	if err != nil {
		g.err = errors.Join(errGatherClosed, err)
		g.buf = nil
		_ = g.Conn.Close()
	}
	return n, err
}
