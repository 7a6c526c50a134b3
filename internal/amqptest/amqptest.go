// Package amqptest gives tests the real RabbitMQ named by TEST_AMQP_URL: an
// exchange and a queue of their own, a consumer that records what arrives,
// and a TCP proxy that can cut connections. A broker that cannot be reached
// fails the test with instructions; it is never a silent skip.
package amqptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URLDefault is used when TEST_AMQP_URL is not set.
const URLDefault = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the test broker URL.
func URL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return URLDefault
}

// Conn opens a connection of the test's own, closed when the test ends.
func Conn(tb testing.TB) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		tb.Fatalf("amqptest: cannot connect to RabbitMQ at TEST_AMQP_URL (default %s): %v\n"+
			"Is it running? Start it with `docker compose up -d --wait rabbitmq`, or on a Debian host with "+
			"`rabbitmq-server -detached`.", strings.Replace(URLDefault, "guest:guest@", "", 1), err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

var nonName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// Name returns a name no other test uses, with the given prefix.
func Name(tb testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonName.ReplaceAllString(tb.Name(), ".")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return prefix + "." + name + "." + hex.EncodeToString(b[:])
}

// Topology is a topic exchange with one queue bound to it.
type Topology struct {
	Exchange string
	Queue    string
}

// Declare declares a topic exchange and a queue bound to it for the routing
// keys given (default "#", everything), and deletes both when the test ends.
func Declare(tb testing.TB, conn *amqp.Connection, keys ...string) Topology {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	defer ch.Close()
	top := Topology{Exchange: Name(tb, "x"), Queue: Name(tb, "q")}
	if err := ch.ExchangeDeclare(top.Exchange, amqp.ExchangeTopic,
		false, // durable
		false, // auto-delete
		false, // internal
		false, // no-wait
		nil); err != nil {
		tb.Fatalf("amqptest: declaring exchange: %v", err)
	}
	if _, err := ch.QueueDeclare(top.Queue,
		false, // durable
		false, // auto-delete
		false, // exclusive
		false, // no-wait
		nil); err != nil {
		tb.Fatalf("amqptest: declaring queue: %v", err)
	}
	if len(keys) == 0 {
		keys = []string{"#"}
	}
	for _, k := range keys {
		if err := ch.QueueBind(top.Queue, k, top.Exchange, false, nil); err != nil {
			tb.Fatalf("amqptest: binding queue: %v", err)
		}
	}
	tb.Cleanup(func() {
		conn, err := amqp.Dial(URL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(top.Queue, false, false, false)
			_ = ch.ExchangeDelete(top.Exchange, false, false)
			ch.Close()
		}
	})
	return top
}

// ManualQueue declares an auto-deleted queue of the test's own and
// consumes it with manual acks on a channel of its own, for tests that ack
// or reject deliveries themselves (an inbox, say). It returns the channel,
// to publish on, the queue's name and the deliveries.
func ManualQueue(tb testing.TB, prefix string) (*amqp.Channel, string, <-chan amqp.Delivery) {
	tb.Helper()
	ch, err := Conn(tb).Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	queue := Name(tb, prefix)
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		tb.Fatalf("amqptest: declaring queue: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		tb.Fatalf("amqptest: consuming: %v", err)
	}
	return ch, queue, deliveries
}

// Exchange declares an auto-deleted topic exchange of the test's own,
// internal (no client may publish to it) if asked, deleted when the test
// ends.
func Exchange(tb testing.TB, prefix string, internal bool) string {
	tb.Helper()
	ch, err := Conn(tb).Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	name := Name(tb, prefix)
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, false, true, internal, false, nil); err != nil {
		tb.Fatalf("amqptest: declaring exchange: %v", err)
	}
	tb.Cleanup(func() { _ = ch.ExchangeDelete(name, false, false); ch.Close() })
	return name
}

// Consumer records the messages that arrive on a queue.
type Consumer struct {
	mu    sync.Mutex
	ids   map[string]int
	total int
	last  amqp.Delivery
	done  chan struct{}
}

// Consume starts consuming queue on a channel of conn until the test ends.
func Consume(tb testing.TB, conn *amqp.Connection, queue string) *Consumer {
	tb.Helper()
	return ConsumeFunc(tb, conn, queue, nil)
}

// ConsumeFunc is Consume that also calls fn, if not nil, for every delivery.
func ConsumeFunc(tb testing.TB, conn *amqp.Connection, queue string, fn func(amqp.Delivery)) *Consumer {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", true /* auto-ack */, false, false, false, nil)
	if err != nil {
		tb.Fatalf("amqptest: consuming %s: %v", queue, err)
	}
	c := &Consumer{ids: make(map[string]int), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for d := range deliveries {
			if fn != nil {
				fn(d)
			}
			c.mu.Lock()
			c.ids[d.MessageId]++
			c.total++
			c.last = d
			c.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		ch.Close()
		<-c.done
	})
	return c
}

// OrderLog records, for every key (the outbox.KeyHeader of a delivery),
// the message ids in the order of their first deliveries. Its Record is a
// ConsumeFunc callback.
type OrderLog struct {
	mu    sync.Mutex
	seen  map[string]bool
	byKey map[string][]string
}

// NewOrderLog returns an empty OrderLog.
func NewOrderLog() *OrderLog {
	return &OrderLog{seen: make(map[string]bool), byKey: make(map[string][]string)}
}

// Record notes d if it is the first delivery of its message id.
func (l *OrderLog) Record(d amqp.Delivery) {
	key, _ := d.Headers["x-event-key"].(string)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[d.MessageId] {
		return
	}
	l.seen[d.MessageId] = true
	l.byKey[key] = append(l.byKey[key], d.MessageId)
}

// Keys returns a copy of the ids of every key in the order of their first
// deliveries.
func (l *OrderLog) Keys() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]string, len(l.byKey))
	for k, ids := range l.byKey {
		out[k] = slices.Clone(ids)
	}
	return out
}

// Distinct returns how many different message ids arrived.
func (c *Consumer) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// Total returns how many deliveries arrived, duplicates included.
func (c *Consumer) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// IDs returns the delivery count of every message id that arrived.
func (c *Consumer) IDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.ids))
	for k, v := range c.ids {
		out[k] = v
	}
	return out
}

// Last returns the last delivery.
func (c *Consumer) Last() amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

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

// CloseNamedConnections makes the broker itself close every connection
// whose client-provided name is name, as an operator or a failing node
// would (rabbitmqctl close_connection, reply 320 CONNECTION_FORCED). It
// returns how many it closed.
func CloseNamedConnections(tb testing.TB, name string) int {
	tb.Helper()
	out, err := rabbitmqctl(tb, "list_connections", "-q", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		tb.Fatalf("amqptest: rabbitmqctl list_connections: %v: %s", err, out)
	}
	closed := 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, `"`+name+`"`) {
			continue
		}
		pid := strings.Fields(line)[0]
		if out, err := rabbitmqctl(tb, "close_connection", pid, "closed by test").CombinedOutput(); err != nil {
			tb.Fatalf("amqptest: rabbitmqctl close_connection: %v: %s", err, out)
		}
		closed++
	}
	return closed
}

// SetMaxMessageSize changes the broker's max_message_size for channels
// opened from now on, and restores the previous value when the test ends.
func SetMaxMessageSize(tb testing.TB, size int) {
	tb.Helper()
	eval := func(expr string) string {
		out, err := rabbitmqctl(tb, "eval", expr).CombinedOutput()
		if err != nil {
			tb.Fatalf("amqptest: rabbitmqctl eval %s: %v: %s", expr, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	prev := eval("{ok, V} = application:get_env(rabbit, max_message_size), V.")
	eval(fmt.Sprintf("application:set_env(rabbit, max_message_size, %d).", size))
	tb.Cleanup(func() { eval("application:set_env(rabbit, max_message_size, " + prev + ").") })
}

// TLSProxy terminates TLS with a fresh self-signed certificate for
// "localhost" and forwards the plain connection to the test broker, so that
// amqps:// can be tested against a broker without a TLS listener. It returns
// the proxy's amqps URL and the certificate pool that trusts it.
func TLSProxy(tb testing.TB) (string, *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		tb.Fatal(err)
	}
	p := serve(tb, ln)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return (&url.URL{Scheme: "amqps", User: p.user, Host: "localhost:" + port, Path: "/"}).String(), pool
}

// Ctl runs rabbitmqctl with args and returns its output, failing the test
// if it fails.
func Ctl(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := rabbitmqctl(tb, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("amqptest: rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// rabbitmqctl returns the command that runs rabbitmqctl with args: the
// prefix in OUTBOX_RABBITMQCTL if set, rabbitmqctl itself if it is on the
// PATH, else rabbitmqctl inside the docker compose service of the repository.
func rabbitmqctl(tb testing.TB, args ...string) *exec.Cmd {
	tb.Helper()
	if prefix := strings.Fields(os.Getenv("OUTBOX_RABBITMQCTL")); len(prefix) > 0 {
		return exec.Command(prefix[0], append(prefix[1:], args...)...)
	}
	if path, err := exec.LookPath("rabbitmqctl"); err == nil {
		return exec.Command(path, args...)
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "docker-compose.yml")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("amqptest: rabbitmqctl is not on the PATH and no docker-compose.yml was found; set OUTBOX_RABBITMQCTL to the command that runs it")
		}
		dir = parent
	}
	return exec.Command("docker", append([]string{"compose", "-f", filepath.Join(dir, "docker-compose.yml"), "exec", "-T", "rabbitmq", "rabbitmqctl"}, args...)...)
}
