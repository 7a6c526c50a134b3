package amqptest

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target and can cut them all at once,
// as a network failure or a broker restart would.
type Proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	conns   []net.Conn
	cuts    int
	wg      sync.WaitGroup
	user    *url.Userinfo
	stalled bool
	gen     int // incremented by Cut, to release stalled pipes
	open    *sync.Cond
}

// NewProxy listens on a free local port and forwards to the test broker.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("amqptest: proxy listen: %v", err)
	}
	return serve(tb, ln)
}

// serve forwards the connections ln accepts to the test broker until the
// test ends.
func serve(tb testing.TB, ln net.Listener) *Proxy {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("amqptest: TEST_AMQP_URL: %v", err)
	}
	p := &Proxy{ln: ln, target: u.Host, user: u.User}
	p.open = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		ln.Close()
		p.Unstall()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Stall stops forwarding in both directions, on the connections there are
// and on new ones, as a broker that hangs or a network that silently drops
// packets would: nothing is closed, nothing arrives.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Unstall lets data flow again.
func (p *Proxy) Unstall() {
	p.mu.Lock()
	p.stalled = false
	p.open.Broadcast()
	p.mu.Unlock()
}

// wait blocks while the proxy is stalled, unless a Cut happened since gen.
func (p *Proxy) wait(gen int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.stalled && p.gen == gen {
		p.open.Wait()
	}
	return p.gen == gen
}

// URL returns an amqp URL that reaches the broker through the proxy.
func (p *Proxy) URL() string {
	return (&url.URL{Scheme: "amqp", User: p.user, Host: p.ln.Addr().String(), Path: "/"}).String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	p.mu.Lock()
	gen := p.gen
	p.mu.Unlock()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(gen) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut closes every connection through the proxy. New connections are
// still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	if len(conns) > 0 {
		p.cuts++
	}
	p.gen++
	p.open.Broadcast()
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Cuts returns how many times Cut closed at least one connection.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}
