package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
// /healthz and /readyz for one relay.
type metricsServer struct {
	srv *http.Server
	obs *outboxotel.Observer
	mp  *sdkmetric.MeterProvider
}

// startMetrics listens on addr at once, so that a busy port fails the
// command before the relay starts, and returns the relay's observer.
//
// Ready means: the relay's last round went through, its last claim is no
// older than within, and the broker answers.
func startMetrics(addr string, store *outbox.Store, pub *relay.AMQPPublisher, x *cli, logger *slog.Logger, health func() relay.Health, within time.Duration) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	ready := func() (bool, int, string) {
		h := health()
		switch {
		case h.Err != nil:
			kind := "failing"
			if h.Permanent {
				kind = "failing permanently"
			}
			return false, http.StatusServiceUnavailable, fmt.Sprintf("not ready: %s: %s", kind, x.secrets.scrub(h.Err.Error()))
		case h.LastClaim.IsZero():
			return false, http.StatusServiceUnavailable, "not ready: no claim yet"
		case time.Since(h.LastClaim) > within:
			return false, http.StatusServiceUnavailable, fmt.Sprintf("not ready: last claim %s ago", time.Since(h.LastClaim).Round(time.Millisecond))
		}
		// An idle relay publishes nothing: check that the broker answers.
		// RabbitMQ answers a refused login after about 3s: wait longer, so
		// that the answer, not a timeout, is what readiness reports.
		ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
		defer cancel()
		if err := pub.Check(ctx); err != nil {
			return false, http.StatusServiceUnavailable, "not ready: " + x.secrets.scrub(err.Error())
		}
		return true, http.StatusOK, fmt.Sprintf("ready: last claim %s ago", time.Since(h.LastClaim).Round(time.Millisecond))
	}
	obs, err := outboxotel.NewObserver(&outboxotel.Config{MeterProvider: mp, Store: store, Unroutable: pub.Unroutable,
		Ready: func() bool { ok, _, _ := ready(); return ok }})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		_, code, text := ready()
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = obs.Close()
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	m := &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, obs: obs, mp: mp}
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("relay: Metrics server stopped", slog.String("error", err.Error()))
		}
	}()
	logger.Info("relay: Serving metrics", slog.String("url", "http://"+ln.Addr().String()+"/metrics"))
	return m, nil
}

func (m *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
	_ = m.obs.Close()
	_ = m.mp.Shutdown(ctx)
}
