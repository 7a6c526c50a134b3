// Package tcpproxy forwards TCP connections from a local port to a target
// and can cut every connection it carries: how outbox verify takes a
// relay's database or broker connection away without administrator
// rights. It can also hold the connections it carries: what their target
// sends is dropped, as if the network lost it, so that a test sees a
// server finish a statement whose client never hears of it.
package tcpproxy

import (
	"errors"
	"net"
	"sync"
)

// Proxy forwards connections from a local port to its target.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]bool // both sides of each connection; true for the target's
	held  map[net.Conn]bool // target sides whose replies are dropped
	cuts  int
	wg    sync.WaitGroup
}

// New listens on a free port of the loopback interface and forwards
// what connects to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}, held: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is where clients connect.
func (p *Proxy) Addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = false, true // true: the target's side
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.held[src]
			p.mu.Unlock()
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
		}
		if err != nil { // EOF, a reset or a cut: the connection ends
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	delete(p.held, dst)
	delete(p.held, src)
	p.mu.Unlock()
}

// Hold makes the connections in flight drop what their target sends from
// now on, and returns how many it holds: their clients' requests still
// reach the target, which runs them, but no reply comes back. Connections
// accepted later are not held; a held one stays so until it is closed.
func (p *Proxy) Hold() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, up := range p.conns {
		if up {
			p.held[c] = true
			n++
		}
	}
	return n
}

// Cut closes every connection in flight and returns how many; new ones
// are accepted.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for c := range p.conns {
		c.Close()
	}
	p.cuts++
	return n
}

// Close stops listening, cuts what is left and waits for its goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// LocalPorts returns the local ports of the connections it holds open to
// the target: how the target names the sessions that came through the
// proxy (MySQL's processlist shows a client's host as host:port).
func (p *Proxy) LocalPorts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ports []int
	for c, up := range p.conns {
		if a, ok := c.LocalAddr().(*net.TCPAddr); ok && up {
			ports = append(ports, a.Port)
		}
	}
	return ports
}
