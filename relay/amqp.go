package relay

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
)

// Defaults of AMQPConfig.
const (
	// AMQPURLDefault is the broker used when AMQPConfig names none.
	AMQPURLDefault = "amqp://guest:guest@localhost:5672/"

	// ConnectionNameDefault is how the relay's connection is named in the
	// broker's management UI.
	ConnectionNameDefault = "acemq-outbox-relay"

	// DialTimeoutDefault bounds one connection attempt to one node.
	DialTimeoutDefault = 10 * time.Second

	// MaxMessageSizeDefault is RabbitMQ's default max_message_size (128 MiB).
	MaxMessageSizeDefault = 128 << 20

	// KeyHeader carries Event.Key (the aggregate id) when it is set.
	KeyHeader = outbox.KeyHeader

	// confirmWindow is the most messages published before their confirms
	// are awaited.
	confirmWindow = 1000

	// closeGrace bounds closing a connection: a broker that stopped
	// answering must not hold the publisher up.
	closeGrace = 2 * time.Second
)

// AMQPConfig configures an AMQPPublisher.
type AMQPConfig struct {
	// ConnectionName names the connection in the broker's management UI.
	// Defaults to "acemq-outbox-relay".
	ConnectionName string

	// DialTimeout bounds one attempt to connect to one node. Defaults to 10s.
	DialTimeout time.Duration

	// Heartbeat is the AMQP heartbeat interval. Defaults to amqp091-go's (10s).
	Heartbeat time.Duration

	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger

	// MaxMessageSize is the largest body the broker accepts, in bytes. A
	// larger message fails (counting an attempt, and eventually parking)
	// without being sent: sent, the broker would close the channel and take
	// the rest of the batch with it. Set it to the broker's max_message_size.
	// Defaults to 128 MiB, RabbitMQ's default. If the broker turns out to
	// accept less, the publisher learns the limit from the broker's error.
	MaxMessageSize int

	// TLSConfig is used for amqps:// URLs. Defaults to Go's defaults (system
	// roots, the URL's host as server name).
	TLSConfig *tls.Config

	// URL is the broker to connect to, amqp:// or amqps://. Defaults to
	// "amqp://guest:guest@localhost:5672/" when URLs is empty too.
	URL string

	// URLs are the nodes of a cluster. They are tried in turn when the
	// publisher (re)connects, starting after the last node that failed; URL,
	// when set, is tried first.
	URLs []string
}

// AMQPPublisher publishes outbox messages to RabbitMQ (or any AMQP 0-9-1
// broker with publisher confirms) over one long-lived connection and one
// channel in confirm mode.
//
// A batch is published whole and its confirms are awaited afterwards, so a
// batch costs one round trip, not one per message. Messages are persistent
// and mandatory: a message no queue is bound for comes back from the broker
// and is reported as unroutable, never as published. The message id is the
// outbox id, the timestamp the time it was written, the type the event type.
//
// When the connection or the channel dies the publisher reports the
// unconfirmed messages as broker faults and connects again on the next
// Publish, trying the configured nodes in turn. Credentials never appear in
// its errors or logs.
type AMQPPublisher struct {
	urls           []string
	display        []string // the URLs without credentials
	tls            *tls.Config
	name           string
	dialTimeout    time.Duration
	heartbeat      time.Duration
	logger         *slog.Logger
	configuredSize int64        // AMQPConfig.MaxMessageSize
	maxMessageSize atomic.Int64 // lower than configuredSize once the broker refused a size

	mu      sync.Mutex // one Publish at a time; guards everything below
	closed  bool
	next    int // node to try first
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	chClose chan *amqp.Error
	blocked *atomic.Bool
}

var _ Publisher = (*AMQPPublisher)(nil)

// NewAMQPPublisher returns a publisher for the configured broker. It checks
// the URLs but does not connect: the first Publish does, so a relay can start
// before its broker does.
func NewAMQPPublisher(cfg *AMQPConfig) (*AMQPPublisher, error) {
	if cfg == nil {
		cfg = &AMQPConfig{}
	}
	urls := append([]string(nil), cfg.URLs...)
	if cfg.URL != "" {
		urls = append([]string{cfg.URL}, urls...)
	}
	if len(urls) == 0 {
		urls = []string{AMQPURLDefault}
	}
	p := &AMQPPublisher{
		urls:        urls,
		tls:         cfg.TLSConfig,
		name:        cmp.Or(cfg.ConnectionName, ConnectionNameDefault),
		dialTimeout: cmp.Or(cfg.DialTimeout, DialTimeoutDefault),
		heartbeat:   cfg.Heartbeat,
		logger:      cfg.Logger,
	}
	if p.logger == nil {
		p.logger = slog.Default()
	}
	if cfg.MaxMessageSize < 0 {
		return nil, fmt.Errorf("relay: AMQPConfig.MaxMessageSize must not be negative (got %d)", cfg.MaxMessageSize)
	}
	p.configuredSize = int64(cmp.Or(cfg.MaxMessageSize, MaxMessageSizeDefault))
	p.maxMessageSize.Store(p.configuredSize)
	for i, u := range urls {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			// The parse error can quote the URL; report only its position.
			return nil, fmt.Errorf("relay: AMQP URL #%d is not a valid amqp:// or amqps:// URL (%s)", i+1, redactedURIError(err, u))
		}
		p.display = append(p.display, displayURI(uri))
	}
	return p, nil
}

func displayURI(u amqp.URI) string {
	return fmt.Sprintf("%s://%s:%d/%s", u.Scheme, u.Host, u.Port, strings.TrimPrefix(u.Vhost, "/"))
}

// redactedURIError keeps amqp091's explanation unless it quotes the URL,
// which may hold a password.
func redactedURIError(err error, raw string) string {
	msg := err.Error()
	secret := raw
	if i, j := strings.Index(raw, "://"), strings.LastIndex(raw, "@"); i >= 0 && j > i {
		secret = raw[i+3 : j]
	}
	if strings.Contains(msg, raw) || strings.Contains(msg, secret) {
		return "malformed URL"
	}
	return msg
}

// Publish sends the batch and waits for the broker's confirms; see
// Publisher. Batches larger than 1000 messages go out in windows of 1000,
// each confirmed before the next is sent.
func (p *AMQPPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, 0, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	for start := 0; start < len(msgs); start += confirmWindow {
		errs = append(errs, p.publishWindow(ctx, msgs[start:min(start+confirmWindow, len(msgs))])...)
	}
	return errs
}

// publishWindow publishes at most confirmWindow messages and awaits their
// confirms. The bound matters: the broker's returns (unroutable messages)
// wait in a buffer larger than the window, so the library never has to
// drop one, which would let an unroutable message pass as published.
func (p *AMQPPublisher) publishWindow(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	fail := func(reason string, err error) []error {
		for i, m := range msgs {
			errs[i] = brokerFault(m.ID, reason, err)
		}
		return errs
	}
	if p.closed {
		return fail("publisher is closed", nil)
	}
	if err := p.ensureChannel(ctx); err != nil {
		return fail("cannot connect to the broker", err)
	}
	if p.blocked.Load() {
		return fail("the broker has blocked the connection (a memory or disk alarm)", nil)
	}

	// A publish that blocks on a socket the broker stopped reading cannot be
	// interrupted otherwise: when ctx ends, the connection goes.
	conn := p.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now().Add(closeGrace)) })
	defer stop()

	type inflight struct {
		i  int
		dc *amqp.DeferredConfirmation
	}
	var (
		pending  = make([]inflight, 0, len(msgs))
		returned = make(map[string]amqp.Return)
		returns  = p.returns
		pubErr   error
		maxSize  = p.maxMessageSize.Load()
		sizeFrom = "AMQPConfig.MaxMessageSize"
	)
	if maxSize < p.configuredSize {
		sizeFrom = "its max_message_size, learned from a refusal"
	}
	take := func(r amqp.Return, ok bool) {
		if !ok { // the channel closed: stop selecting on it
			returns = nil
			return
		}
		returned[r.MessageId] = r
	}
	drain := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				take(r, ok)
			default:
				return
			}
		}
	}
	for i := range msgs {
		m := &msgs[i]
		if int64(len(m.Payload)) > maxSize {
			errs[i] = messageFault(m.ID, fmt.Sprintf("message body is %d bytes, larger than the %d bytes the broker accepts (%s); store large payloads elsewhere and send a reference", len(m.Payload), maxSize, sizeFrom))
			continue
		}
		if reason := unencodable(m); reason != "" {
			errs[i] = messageFault(m.ID, reason)
			continue
		}
		if pubErr != nil {
			errs[i] = brokerFault(m.ID, "channel failed during the batch", pubErr)
			continue
		}
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey,
			true,  // mandatory: an unroutable message comes back instead of vanishing
			false, // immediate: not supported by RabbitMQ
			publishing(m))
		if err != nil {
			pubErr = err
			if encodingError(err) {
				// The library refused this message, not the network.
				// Blaming it keeps a message nothing can send from
				// blocking the outbox; the connection is dropped below,
				// as its state is uncertain after a partial publish.
				errs[i] = messageFault(m.ID, "the AMQP client could not encode the message: "+err.Error())
			} else {
				errs[i] = brokerFault(m.ID, "channel failed during the batch", err)
			}
			continue
		}
		pending = append(pending, inflight{i, dc})
		drain()
	}

	// Await every confirm. Returns for a message precede its confirm, and are
	// read here while waiting so that the library never has to drop one.
	timedOut := false
	for _, pd := range pending {
	wait:
		for {
			select {
			case r, ok := <-returns:
				take(r, ok)
			case <-pd.dc.Done():
				break wait
			case <-ctx.Done():
				timedOut = true
				break wait
			}
		}
		if timedOut {
			break
		}
	}
	drain()

	lost := timedOut || pubErr != nil || p.ch.IsClosed()
	var closeErr *amqp.Error
	if lost {
		select {
		case closeErr = <-p.chClose:
		default:
		}
	}
	acked := make([]bool, len(msgs))
	for _, pd := range pending {
		m := &msgs[pd.i]
		select {
		case <-pd.dc.Done():
		default:
			errs[pd.i] = brokerFault(m.ID, "no confirm from the broker in time", ctx.Err())
			continue
		}
		switch r, ok := returned[m.ID]; {
		case ok:
			errs[pd.i] = messageFault(m.ID, fmt.Sprintf("unroutable: no queue is bound to exchange %q for routing key %q (broker replied %d %s); bind a queue or change the Router",
				r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
		case pd.dc.Acked():
			acked[pd.i] = true
		case !lost:
			errs[pd.i] = messageFault(m.ID, "the broker refused the message (nack): a queue may be full with overflow reject-publish, or the broker had an internal error")
		}
	}
	if lost {
		// Whatever the channel took with it is unconfirmed: never published.
		for i := range msgs {
			var pe *PublishError
			if !acked[i] && (errs[i] == nil || errors.As(errs[i], &pe) && pe.BrokerFault) {
				errs[i] = p.blame(&msgs[i], closeErr)
			}
		}
		p.discard(false)
	}
	return errs
}

var maxSizeRe = regexp.MustCompile(`larger than configured max size (\d+)`)

// blame decides, from the reason the broker gave for closing the channel,
// whether an unconfirmed message caused it. A missing exchange or an
// oversized body is the message's fault; anything else is the broker's.
func (p *AMQPPublisher) blame(m *outbox.Message, closeErr *amqp.Error) error {
	if closeErr != nil {
		switch closeErr.Code {
		case amqp.NotFound:
			if strings.Contains(closeErr.Reason, fmt.Sprintf("no exchange '%s'", m.Exchange)) {
				return messageFault(m.ID, fmt.Sprintf("exchange %q does not exist (broker replied %d %s); declare it or change the Router", m.Exchange, closeErr.Code, closeErr.Reason))
			}
		case amqp.PreconditionFailed:
			if sm := maxSizeRe.FindStringSubmatch(closeErr.Reason); sm != nil {
				limit, _ := strconv.ParseInt(sm[1], 10, 64)
				if limit > 0 && limit < p.maxMessageSize.Load() {
					p.maxMessageSize.Store(limit)
				}
				if int64(len(m.Payload)) > limit {
					return messageFault(m.ID, fmt.Sprintf("message body is %d bytes, larger than the broker's max_message_size of %d bytes; store large payloads elsewhere and send a reference", len(m.Payload), limit))
				}
			}
		}
		return brokerFault(m.ID, "the broker closed the channel before confirming", closeErr)
	}
	return brokerFault(m.ID, "the connection was lost or timed out before the broker confirmed", nil)
}

// encodingError reports whether a publish error is amqp091-go refusing the
// message's content rather than a failing connection.
func encodingError(err error) bool {
	return errors.Is(err, amqp.ErrFieldType) || strings.Contains(err.Error(), "exceeds 255 bytes")
}

// unencodable says why AMQP 0-9-1 cannot carry m, or returns "": short
// strings (names, keys, properties, header names) hold at most 255 bytes.
// Store.Add refuses such events; this guards rows written otherwise.
func unencodable(m *outbox.Message) string {
	for _, f := range []struct{ what, v string }{
		{"exchange", m.Exchange}, {"routing key", m.RoutingKey}, {"content type", m.ContentType},
		{"event type", m.EventType}, {"message id", m.ID},
	} {
		if len(f.v) > 255 {
			return fmt.Sprintf("the %s is %d bytes; AMQP allows at most 255", f.what, len(f.v))
		}
	}
	for k := range m.Headers {
		if len(k) > 255 {
			return fmt.Sprintf("header name %.40q… is %d bytes; AMQP allows at most 255", k, len(k))
		}
	}
	return ""
}

func publishing(m *outbox.Message) amqp.Publishing {
	var headers amqp.Table
	if len(m.Headers) > 0 || m.Key != "" {
		headers = make(amqp.Table, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		if m.Key != "" {
			headers[KeyHeader] = m.Key
		}
	}
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    m.CreatedAt,
		Type:         m.EventType,
		Body:         m.Payload,
	}
}

// ensureChannel connects and opens the confirm-mode channel if needed.
func (p *AMQPPublisher) ensureChannel(ctx context.Context) error {
	if p.conn == nil || p.conn.IsClosed() {
		p.discard(true)
		if err := p.dial(ctx); err != nil {
			return err
		}
	}
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		p.discard(true)
		return fmt.Errorf("opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		p.discard(true)
		return fmt.Errorf("enabling publisher confirms: %w", err)
	}
	p.ch = ch
	// Buffered beyond the confirm window, and drained while confirms are
	// awaited: amqp091-go drops notifications a listener does not take
	// within seconds, and a dropped return would let an unroutable message
	// pass as published.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, confirmWindow+24))
	p.chClose = ch.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// dial connects to the first node that answers, starting with p.next.
func (p *AMQPPublisher) dial(ctx context.Context) error {
	var errs []error
	for k := range p.urls {
		if err := ctx.Err(); err != nil {
			return err
		}
		i := (p.next + k) % len(p.urls)
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(p.name)
		conn, err := p.dialNode(ctx, p.urls[i], props)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.display[i], err))
			p.logger.WarnContext(ctx, "relay: Cannot connect to broker node", slog.String("node", p.display[i]), slog.String("error", err.Error()))
			continue
		}
		p.next = i
		p.conn = conn
		blocked := &atomic.Bool{}
		p.blocked = blocked
		go func(c chan amqp.Blocking) { // always drained, see ensureChannel
			for b := range c {
				blocked.Store(b.Active)
			}
		}(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
		p.logger.InfoContext(ctx, "relay: Connected to broker", slog.String("node", p.display[i]))
		return nil
	}
	p.next = (p.next + 1) % len(p.urls)
	return errors.Join(errs...)
}

// dialNode connects to one node. amqp091-go's dial is not context-aware; the
// socket is closed when ctx ends, so that a shutdown is not held up by a
// broker that accepts connections and then does not answer.
func (p *AMQPPublisher) dialNode(ctx context.Context, url string, props amqp.Table) (*amqp.Connection, error) {
	var (
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
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat:       p.heartbeat,
		TLSClientConfig: p.tls,
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: p.dialTimeout}
			s, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// A deadline for the TLS and AMQP handshakes; amqp091-go clears
			// it once the connection is open, as with its DefaultDial.
			if err := s.SetDeadline(time.Now().Add(p.dialTimeout)); err != nil {
				s.Close()
				return nil, err
			}
			mu.Lock()
			sockets = append(sockets, s)
			mu.Unlock()
			return s, nil
		},
	})
	if !stop() { // ctx ended during the dial: whatever it produced is closed
		if conn != nil {
			_ = conn.Close()
		}
		return nil, ctx.Err()
	}
	return conn, err
}

// discard drops the channel, and the connection too when it is dead or all
// is set. The next Publish opens what is missing. It never waits for a
// broker that does not answer: a channel is closed only once the broker
// closed it (a no-op), and a connection with a deadline.
func (p *AMQPPublisher) discard(all bool) {
	if p.ch != nil {
		go func(c chan amqp.Return) { // let the library finish whatever it still sends
			for range c {
			}
		}(p.returns)
		if p.ch.IsClosed() {
			_ = p.ch.Close()
		} else {
			all = true // an open channel we give up on goes with its connection
		}
		p.ch = nil
	}
	if p.conn != nil && (all || p.conn.IsClosed()) {
		_ = p.conn.CloseDeadline(time.Now().Add(closeGrace))
		p.conn = nil
		p.logger.Warn("relay: Broker connection dropped; reconnecting on the next batch")
	}
}

// Close closes the connection (and with it the channel), waiting at most a
// few seconds for the broker. Publish fails with a broker fault afterwards.
func (p *AMQPPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.ch = nil
	if p.conn == nil {
		return nil
	}
	err := p.conn.CloseDeadline(time.Now().Add(closeGrace))
	p.conn = nil
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}
