package relay

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/internal/throttle"
	"github.com/acemq/outbox/topology"
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

	// reportEvery is the fewest confirmed messages PublishConfirming
	// reports before it waits for the next confirm (it reports the rest
	// when the window is confirmed). It gathers more while their confirms
	// are already there.
	reportEvery = 25

	// closeReasonWait bounds the wait for the reason of a channel that is
	// already closed.
	closeReasonWait = 500 * time.Millisecond
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

	// Topology, when set, is declared on every connection the publisher
	// opens, before it publishes: the exchanges it publishes to, and the
	// consumers' queues if this program owns them (see package topology).
	// A refused declaration is a broker fault: logged, retried.
	Topology *topology.Topology

	// Unroutable says what to do with a message no queue is bound for:
	// park it (UnroutablePark, the default), publish it to
	// AlternateExchange (UnroutableAlternate), or drop it and count it
	// (UnroutableDrop). See Unroutable for the trade-off.
	Unroutable Unroutable

	// AlternateExchange receives unroutable messages under
	// UnroutableAlternate. Required then, and only then.
	AlternateExchange string

	// MaxConnections bounds the connections the publisher opens, one for
	// each publish running at once: past it, a publish waits for a free
	// one (its batch's lease runs meanwhile). The tables of a Group share
	// them. Defaults to 0: as many as publishes run at once (a relay's
	// Config.MaxInFlight; a group's, that many for each busy table).
	MaxConnections int

	// URLs are the nodes of a cluster. They are tried in turn when the
	// publisher (re)connects, starting with the node after the one it was
	// last connected to, so that a node that just failed (or hangs
	// instead of refusing) is tried last; URL, when set, is tried first
	// at start-up.
	URLs []string
}

// AMQPPublisher publishes outbox messages to RabbitMQ (or any AMQP 0-9-1
// broker with publisher confirms) over one long-lived connection and one
// channel in confirm mode.
//
// A batch is published whole and its confirms are awaited afterwards, so a
// batch costs one round trip, not one per message; its publishes are
// written to the socket together (up to 256 KiB a write), not one write per
// message as amqp091-go does alone. Messages are persistent
// and mandatory: a message no queue is bound for comes back from the broker
// and is reported as unroutable (or diverted or dropped, as
// AMQPConfig.Unroutable says), never as published by mistake. The message id is the
// outbox id, the timestamp the time it was written, the type the event type.
//
// When the connection or the channel dies the publisher reports the
// unconfirmed messages as broker faults and connects again on the next
// Publish, trying the configured nodes in turn. Credentials never appear in
// its errors or logs.
type AMQPPublisher struct {
	dialer         *amqpdial.Dialer
	topology       *topology.Topology
	unroutable     Unroutable
	alternate      string
	unroutableLog  throttle.Throttle
	diverted       atomic.Int64
	dropped        atomic.Int64
	logger         *slog.Logger
	configuredSize int64        // AMQPConfig.MaxMessageSize
	maxMessageSize atomic.Int64 // lower than configuredSize once the broker refused a size

	closed  atomic.Bool
	lanesMu sync.Mutex
	lanes   []*amqpLane
	conns   chan struct{} // a token for each publish running, when AMQPConfig.MaxConnections bounds them
}

// amqpLane is one connection of an AMQPPublisher with its confirm-mode
// channel. A Publish takes a lane that is free, or opens a new one, so
// that concurrent Publish calls (a relay with Config.MaxInFlight > 1)
// publish side by side, each awaiting only its own confirms.
type amqpLane struct {
	*AMQPPublisher
	mu      sync.Mutex // held for a whole Publish; guards everything below
	next    int        // node to try first
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	chClose chan *amqp.Error
	blocked *atomic.Bool
	gather  *amqpdial.Gather // the socket under conn: a window's publishes are written together
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
	if cfg.MaxMessageSize < 0 {
		return nil, fmt.Errorf("relay: AMQPConfig.MaxMessageSize must not be negative (got %d)", cfg.MaxMessageSize)
	}
	if cfg.MaxConnections < 0 {
		return nil, fmt.Errorf("relay: AMQPConfig.MaxConnections must not be negative (got %d)", cfg.MaxConnections)
	}
	if cfg.DialTimeout < 0 {
		return nil, fmt.Errorf("relay: AMQPConfig.DialTimeout must not be negative (got %s)", cfg.DialTimeout)
	}
	dialer, err := amqpdial.New("relay", "AMQP URL", amqpdial.Config{URLs: urls, TLS: cfg.TLSConfig,
		Timeout: cmp.Or(cfg.DialTimeout, DialTimeoutDefault), Heartbeat: cfg.Heartbeat,
		Name: cmp.Or(cfg.ConnectionName, ConnectionNameDefault)})
	if err != nil {
		return nil, err
	}
	if cfg.Topology != nil {
		if err := cfg.Topology.Validate(); err != nil {
			return nil, fmt.Errorf("relay: AMQPConfig.Topology: %w", err)
		}
	}
	switch {
	case cfg.Unroutable < UnroutablePark || cfg.Unroutable > UnroutableDrop:
		return nil, fmt.Errorf("relay: AMQPConfig.Unroutable is %s: use UnroutablePark, UnroutableAlternate or UnroutableDrop", cfg.Unroutable)
	case cfg.Unroutable == UnroutableAlternate && cfg.AlternateExchange == "":
		return nil, errors.New("relay: AMQPConfig.Unroutable is UnroutableAlternate: AlternateExchange must name the exchange")
	case cfg.Unroutable != UnroutableAlternate && cfg.AlternateExchange != "":
		return nil, errors.New("relay: AMQPConfig.AlternateExchange is set, but Unroutable is not UnroutableAlternate")
	}
	p := &AMQPPublisher{dialer: dialer, logger: cmp.Or(cfg.Logger, slog.Default()), unroutable: cfg.Unroutable, alternate: cfg.AlternateExchange, topology: cfg.Topology,
		unroutableLog: throttle.Throttle{Every: unroutableLogEvery}}
	if cfg.MaxConnections > 0 {
		p.conns = make(chan struct{}, cfg.MaxConnections)
	}
	p.configuredSize = int64(cmp.Or(cfg.MaxMessageSize, MaxMessageSizeDefault))
	p.maxMessageSize.Store(p.configuredSize)
	return p, nil
}

// Publish sends the batch and waits for the broker's confirms; see
// Publisher. It is safe for concurrent use: concurrent calls publish on
// connections of their own, opened as needed. Batches larger than 1000
// messages go out in windows of 1000, each confirmed before the next is
// sent.
//
// When the broker closes the channel or the connection because of
// something the client sent (an ACCESS_REFUSED exchange, a frame too large,
// …) and the reason does not name the message, Publish finds it: it
// publishes the unconfirmed messages again in halves, each on a fresh
// channel, down to the single message that the broker still refuses. That
// message alone is reported as failed (its fault, an attempt counted); the
// others are published.
func (p *AMQPPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return p.PublishConfirming(ctx, msgs, nil)
}

// PublishConfirming is Publish that reports confirmed messages as their
// confirms arrive (see ConfirmingPublisher). A message is reported once
// the broker acked it and did not return it: a return precedes its ack, so
// it has been read by then. Confirms are reported in groups: at least 25
// before it waits for the next confirm, all that arrived together, and the
// rest when the window is confirmed, so that each report costs the relay
// a statement for many messages and holds none while it waits.
func (p *AMQPPublisher) PublishConfirming(ctx context.Context, msgs []outbox.Message, confirmed func(indices []int)) []error {
	errs := make([]error, 0, len(msgs))
	if p == nil { // a nil *AMQPPublisher: not usable, like a closed one
		for _, m := range msgs {
			errs = append(errs, brokerFault(m.ID, ClassClosed, "the publisher is nil", ErrPublisherClosed))
		}
		return errs
	}
	if p.conns != nil {
		select {
		case p.conns <- struct{}{}:
			defer func() { <-p.conns }()
		case <-ctx.Done():
			for _, m := range msgs {
				errs = append(errs, brokerFault(m.ID, ClassTimeout, "no free connection (AMQPConfig.MaxConnections) in time", ctx.Err()))
			}
			return errs
		}
	}
	l := p.lane()
	defer l.mu.Unlock()
	for start := 0; start < len(msgs); start += confirmWindow {
		window := msgs[start:min(start+confirmWindow, len(msgs))]
		var report func([]int)
		if confirmed != nil {
			report = func(ix []int) {
				for k := range ix {
					ix[k] += start
				}
				confirmed(ix)
			}
		}
		werrs := l.publishIsolating(ctx, window, 0, report)
		l.settleUnroutable(ctx, window, werrs)
		errs = append(errs, werrs...)
	}
	return errs
}

// Check connects to the broker if no connection is open and reports
// whether one is: for readiness checks, so that an idle relay whose broker
// is unreachable does not pass for ready. It uses a free connection of the
// publisher, or opens one.
func (p *AMQPPublisher) Check(ctx context.Context) error {
	if p == nil || p.closed.Load() {
		return ErrPublisherClosed
	}
	if connected, busy := p.lanesConnected(); connected || busy {
		return nil // a lane publishing: its outcome, not a check, tells
	}
	l := p.lane() // no open connection: open one, as the next Publish would
	defer l.mu.Unlock()
	if err := l.ensureChannel(ctx); err != nil {
		return fmt.Errorf("relay: broker unreachable: %w", err)
	}
	return nil
}

// prober is a Publisher that can tell, without publishing, whether the
// broker answers: the relay asks while it backs off after a broker fault,
// and claims again as soon as it does.
type prober interface {
	probe(ctx context.Context) error
}

// probe reports whether the broker answers: nil when a free lane's
// connection is open, or when one opens now (and stays, for the next
// publish). Unlike Check, a lane busy publishing proves nothing. A failed
// dial is logged at debug level: the relay's backoff has said the broker
// is unavailable.
func (p *AMQPPublisher) probe(ctx context.Context) error {
	if p.closed.Load() {
		return ErrPublisherClosed
	}
	if connected, busy := p.lanesConnected(); connected || busy && p.conns != nil && len(p.conns) == cap(p.conns) {
		return nil // every connection it may open is publishing: their outcomes tell
	}
	l := p.lane()
	defer l.mu.Unlock()
	return l.ensureChannel(context.WithValue(ctx, quietDial{}, true))
}

// lanesConnected reports whether a lane not busy publishing has an open
// connection, and whether a lane is busy publishing.
func (p *AMQPPublisher) lanesConnected() (connected, busy bool) {
	p.lanesMu.Lock()
	lanes := p.lanes
	p.lanesMu.Unlock()
	for _, l := range lanes {
		if !l.mu.TryLock() {
			busy = true
			continue
		}
		c := l.conn != nil && !l.conn.IsClosed()
		l.mu.Unlock()
		if c {
			return true, busy
		}
	}
	return false, busy
}

// quietDial, as a context's value, makes a failed dial log at debug level.
type quietDial struct{}

// Concurrent reports that Publish may be called concurrently.
func (p *AMQPPublisher) Concurrent() bool { return true }

// lane returns a free lane, locked, opening a new one if all are busy.
func (p *AMQPPublisher) lane() *amqpLane {
	p.lanesMu.Lock()
	defer p.lanesMu.Unlock()
	for _, l := range p.lanes {
		if l.mu.TryLock() {
			return l
		}
	}
	l := &amqpLane{AMQPPublisher: p}
	l.mu.Lock()
	p.lanes = append(p.lanes, l)
	return l
}

// unconfirmedMax is the most messages a lane has published and not yet seen
// confirmed: past it, it waits for the oldest confirm before it publishes
// the next message. What the broker routed and had not confirmed when a
// connection drops is published again (it cannot be told apart from what
// it never received): this bounds that, for each lane, whatever the size
// of a batch. Without it a relay catching up on a backlog, full batches on
// every lane, had hundreds of messages unconfirmed at once, and a broker
// fault then cost as many duplicates. 64 cost no throughput that the
// broker's own spread between runs could show (see BENCHMARKS.md).
const unconfirmedMax = 64
