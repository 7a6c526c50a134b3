// Package amqpdial is the one way this module connects to RabbitMQ: the
// relay's publisher and the inbox's consumer both dial through it. It
// parses the configured URLs once (errors never quote them: they may hold
// a password), dials one node with a timeout that covers the TCP, TLS and
// AMQP handshakes and with the caller's context, and names the nodes for
// logs without their credentials.
package amqpdial

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/internal/redact"
)

// TimeoutDefault bounds one connection attempt to one node.
const TimeoutDefault = 10 * time.Second

// Config says how to reach the broker.
type Config struct {
	URLs      []string      // amqp:// or amqps://, tried in turn
	TLS       *tls.Config   // for amqps:// URLs; nil: Go's defaults
	Timeout   time.Duration // one attempt to one node; 0: TimeoutDefault
	Heartbeat time.Duration // 0: amqp091-go's default
	Name      string        // the connection's name in the management UI
}

// Dialer dials the nodes of one configuration.
type Dialer struct {
	cfg       Config
	display   []string
	passwords []string
}

// New checks cfg. prefix starts its errors ("relay", "inbox"); field names
// the setting the URLs came from, for them.
func New(prefix, field string, cfg Config) (*Dialer, error) {
	if len(cfg.URLs) == 0 {
		return nil, fmt.Errorf("%s: %s names no broker", prefix, field)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%s: the dial timeout must not be negative (got %s)", prefix, cfg.Timeout)
	}
	if cfg.Heartbeat < 0 {
		return nil, fmt.Errorf("%s: the heartbeat must not be negative (got %s)", prefix, cfg.Heartbeat)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = TimeoutDefault
	}
	cfg.URLs = append([]string(nil), cfg.URLs...)
	d := &Dialer{cfg: cfg}
	for i, u := range cfg.URLs {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			// The parse error can quote the URL, or the start of a
			// password cut at a '/', '#' or '?': report its position and
			// the kind of problem only.
			return nil, fmt.Errorf("%s: %s #%d is not a valid amqp:// or amqps:// URL (%s)", prefix, field, i+1, redact.Reason(err))
		}
		d.display = append(d.display, Display(uri))
		if uri.Password != "" {
			d.passwords = append(d.passwords, uri.Password)
		}
	}
	return d, nil
}

// Named returns a dialer of the same nodes whose connections carry name in
// the management UI.
func (d *Dialer) Named(name string) *Dialer {
	n := *d
	n.cfg.Name = name
	return &n
}

// Nodes is how many URLs there are.
func (d *Dialer) Nodes() int { return len(d.cfg.URLs) }

// Display names node i without credentials.
func (d *Dialer) Display(i int) string { return d.display[i] }

// Timeout is the configured timeout of one attempt.
func (d *Dialer) Timeout() time.Duration { return d.cfg.Timeout }

// Redact replaces the configured passwords in s.
func (d *Dialer) Redact(s string) string {
	for _, p := range d.passwords {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

// Dial connects to node i. amqp091-go's dial is not context-aware; the
// socket is closed when ctx ends, so that a shutdown is not held up by a
// broker that accepts connections and then does not answer.
func (d *Dialer) Dial(ctx context.Context, i int) (*amqp.Connection, error) {
	conn, _, err := d.dial(ctx, i, false)
	return conn, err
}

// DialGather is Dial, and returns the socket under the connection, to
// gather the writes of a window of publishes (see Gather). With amqps://
// it is under TLS: what it gathers are TLS records.
func (d *Dialer) DialGather(ctx context.Context, i int) (*amqp.Connection, *Gather, error) {
	return d.dial(ctx, i, true)
}

// dial connects to node i, with a Gather under the connection if gather
// is set (a consumer's writes, acks one at a time, gain nothing from one).
func (d *Dialer) dial(ctx context.Context, i int, gather bool) (*amqp.Connection, *Gather, error) {
	var (
		g       *Gather
		mu      sync.Mutex
		sockets []net.Conn
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range sockets {
			_ = s.Close()
		}
	})
	props := amqp.NewConnectionProperties()
	if d.cfg.Name != "" {
		props.SetClientConnectionName(d.cfg.Name)
	}
	conn, err := amqp.DialConfig(d.cfg.URLs[i], amqp.Config{
		Heartbeat:       d.cfg.Heartbeat,
		TLSClientConfig: d.cfg.TLS,
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			nd := net.Dialer{Timeout: d.cfg.Timeout}
			s, err := nd.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// A deadline for the TLS and AMQP handshakes; amqp091-go clears
			// it once the connection is open, as with its DefaultDial.
			if err := s.SetDeadline(time.Now().Add(d.cfg.Timeout)); err != nil {
				s.Close()
				return nil, err
			}
			mu.Lock()
			sockets = append(sockets, s)
			mu.Unlock()
			if !gather {
				return s, nil
			}
			g = &Gather{Conn: s}
			return g, nil
		},
	})
	if !stop() { // ctx ended during the dial: whatever it produced is closed
		if conn != nil {
			_ = conn.Close()
		}
		return nil, nil, ctx.Err()
	}
	if err != nil {
		return nil, nil, err // amqp091-go's errors do not quote the URL
	}
	return conn, g, nil
}

// Display names a broker node without its credentials.
func Display(u amqp.URI) string {
	return fmt.Sprintf("%s://%s:%d/%s", u.Scheme, u.Host, u.Port, strings.TrimPrefix(u.Vhost, "/"))
}
