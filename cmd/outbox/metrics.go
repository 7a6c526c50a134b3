package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/outboxotel"
	"github.com/acemq/outbox/relay"
)

// readyCheckTimeout bounds the broker check of /readyz; probes that call it
// should allow as long.
const readyCheckTimeout = 5 * time.Second

// metricsServer serves /metrics (OpenTelemetry's Prometheus exporter),
// /healthz and /readyz for the relay of one table or several, and makes
// each table's relay an observer (its series labelled outbox.table).
type metricsServer struct {
	srv    *http.Server
	mp     *sdkmetric.MeterProvider
	pub    *relay.AMQPPublisher
	group  bool // several tables (or tables that come and go)
	health func() map[string]relay.Health
	ready  func() (bool, int, string)
	ready1 func(relay.Health) (bool, string)

	mu   sync.Mutex
	obs  map[string]*outboxotel.Observer // by table
	unr  *outboxotel.Observer            // a group's publisher's unroutable count
	done bool
}

// startMetrics listens on addr at once, so that a busy port fails the
// command before the relay starts; observe makes each table's observer.
// group says that the relay has several tables, or may have (--tables).
//
// Ready means: every table's relay's last round went through, its last
// claim is no older than within() (which grows with a group's idle
// waits), and the broker answers. When one is not, /readyz names it.
func startMetrics(addr string, pub *relay.AMQPPublisher, x *cli, logger *slog.Logger, group bool, health func() map[string]relay.Health, within func() time.Duration) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	m := &metricsServer{mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), pub: pub, group: group, health: health,
		obs: map[string]*outboxotel.Observer{}}
	m.ready1 = func(h relay.Health) (bool, string) {
		switch {
		case h.Err != nil:
			kind := "failing"
			if h.Permanent {
				kind = "failing permanently"
			}
			return false, fmt.Sprintf("%s: %s", kind, x.secrets.scrub(h.Err.Error()))
		case h.LastClaim.IsZero():
			return false, "no claim yet"
		case time.Since(h.LastClaim) > within():
			return false, fmt.Sprintf("last claim %s ago", time.Since(h.LastClaim).Round(time.Millisecond))
		}
		return true, ""
	}
	m.ready = func() (bool, int, string) {
		hs := health()
		last := time.Time{}
		for _, table := range slices.Sorted(maps.Keys(hs)) {
			h := hs[table]
			if ok, why := m.ready1(h); !ok {
				if group {
					why = table + ": " + why
				}
				return false, http.StatusServiceUnavailable, "not ready: " + why
			}
			if h.LastClaim.After(last) {
				last = h.LastClaim
			}
		}
		// An idle relay publishes nothing: check that the broker answers.
		// RabbitMQ answers a refused login after about 3s: wait longer, so
		// that the answer, not a timeout, is what readiness reports.
		ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
		defer cancel()
		if err := pub.Check(ctx); err != nil {
			return false, http.StatusServiceUnavailable, "not ready: " + x.secrets.scrub(err.Error())
		}
		if len(hs) == 0 {
			return true, http.StatusOK, "ready: no table yet"
		}
		return true, http.StatusOK, fmt.Sprintf("ready: last claim %s ago", time.Since(last).Round(time.Millisecond))
	}
	if group {
		// The publisher's count, once, without a table's label.
		if m.unr, err = outboxotel.NewObserver(&outboxotel.Config{MeterProvider: m.mp, Unroutable: pub.Unroutable}); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		_, code, text := m.ready()
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		m.closeObservers()
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	m.srv = serveHTTP(ln, mux, metricsLimits, logger)
	logger.Info("relay: Serving metrics", slog.String("url", "http://"+ln.Addr().String()+"/metrics"))
	return m, nil
}

// observe makes the observer of st's table's relay: its gauges, and,
// ready, whether it is (of a group: that table's relay; else the whole
// of /readyz).
func (m *metricsServer) observe(st *outbox.Store) (*outboxotel.Observer, error) {
	cfg := &outboxotel.Config{MeterProvider: m.mp, Store: st, Ready: func() bool { ok, _, _ := m.ready(); return ok }}
	if m.group {
		table := st.Table()
		cfg.Ready = func() bool { ok, _ := m.ready1(m.health()[table]); return ok }
	} else {
		cfg.Unroutable = m.pub.Unroutable
	}
	obs, err := outboxotel.NewObserver(cfg)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		_ = obs.Close()
		return nil, errors.New("the metrics server is closed")
	}
	m.obs[st.Table()] = obs
	return obs, nil
}

// forget ends the series of a table's relay: the table left the group.
func (m *metricsServer) forget(table string) {
	m.mu.Lock()
	obs := m.obs[table]
	delete(m.obs, table)
	m.mu.Unlock()
	if obs != nil {
		_ = obs.Close()
	}
}

// serveLimits bound what clients of a server can hold.
type serveLimits struct {
	readHeader time.Duration // to send a request's headers
	write      time.Duration // to take a response, from the end of its request's headers
	idle       time.Duration // a keep-alive connection waiting for its next request
	maxConns   int           // connections served at once; more wait to be accepted
}

// metricsLimits bound the metrics server's clients: a scraper needs one
// or two connections, and without an idle timeout 20,000 idle keep-alive
// connections held as many file descriptors of the relay, whose database
// connections then failed with "too many open files". The write bound
// leaves /readyz its broker check.
var metricsLimits = serveLimits{readHeader: 5 * time.Second, write: readyCheckTimeout + 5*time.Second, idle: 30 * time.Second, maxConns: 32}

// serveHTTP serves h on ln within lim, in a goroutine of its own, until
// the returned server is shut down.
func serveHTTP(ln net.Listener, h http.Handler, lim serveLimits, logger *slog.Logger) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: lim.readHeader, WriteTimeout: lim.write, IdleTimeout: lim.idle}
	go func() {
		if err := srv.Serve(newLimitListener(ln, lim.maxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("relay: Metrics server stopped", slog.String("error", err.Error()))
		}
	}()
	return srv
}

// limitListener accepts at most n connections at once: Accept waits for
// one of them to close, and the connections beyond wait in the kernel's
// backlog, holding no file descriptor of the process.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its slot back when it is closed, once.
type limitConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

func (m *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
	m.closeObservers()
	_ = m.mp.Shutdown(ctx)
}

func (m *metricsServer) closeObservers() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done = true
	for _, o := range m.obs {
		_ = o.Close()
	}
	if m.unr != nil {
		_ = m.unr.Close()
	}
}
