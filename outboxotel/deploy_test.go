package outboxotel_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxotel"
	"github.com/acemq/outbox/relay"
)

// exported returns the metric family and label names the Prometheus
// exporter really emits once every instrument has recorded something.
func exported(t *testing.T) (families, labels map[string]bool) {
	t.Helper()
	ctx := context.Background()
	store, err := outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Table: dbtest.Table(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	obs, err := outboxotel.NewObserver(&outboxotel.Config{MeterProvider: mp,
		Store: store, Ready: func() bool { return true }, Unroutable: func() relay.UnroutableStats { return relay.UnroutableStats{Dropped: 1} }})
	require.NoError(t, err)
	defer obs.Close()
	inboxObs, err := outboxotel.NewInboxObserver(mp, "billing")
	require.NoError(t, err)
	inboxObs.Handled(ctx, &amqp.Delivery{RoutingKey: "order.placed"}, inbox.DeadLettered, time.Millisecond, errors.New("x"))
	m := &outbox.Message{ID: "m"}
	obs.Claimed(ctx, 1, time.Millisecond, nil)
	obs.Claimed(ctx, 0, time.Millisecond, context.DeadlineExceeded)
	obs.Published(ctx, 1, time.Millisecond)
	obs.Lag(ctx, m, time.Second)
	obs.Failed(ctx, m, relay.ClassUnroutable, true)
	obs.Released(ctx, 1, relay.ReleasedShutdown)
	obs.LeasesLost(ctx, 1)
	obs.Settled(ctx, time.Millisecond, nil)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	families, labels = map[string]bool{}, map[string]bool{}
	for _, mf := range mfs {
		families[mf.GetName()] = true
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	return families, labels
}

var (
	metricName = regexp.MustCompile(`\b(?:outbox|messaging)_[a-z_]+\b`)
	labelName  = regexp.MustCompile(`\b(outbox_table|outbox_release_reason|outbox_unroutable_action|outbox_inbox_outcome|error_type|messaging_[a-z_]+)\s*(?:=~|=|!=|\))|by \(([^)]*)\)`)
	gauge      = regexp.MustCompile(`\b(outbox_pending|outbox_ready|outbox_in_flight|outbox_retrying|outbox_parked|outbox_held|outbox_keys_blocked|outbox_oldest_pending_age_seconds|outbox_oldest_ready_age_seconds)\b`)
)

// checkExpr fails the test for a metric or label in expr that the
// exporter does not emit.
func checkExpr(t *testing.T, where, expr string, families, labels map[string]bool) {
	t.Helper()
	for _, name := range metricName.FindAllString(expr, -1) {
		if labels[name] {
			continue // a label, such as outbox_table
		}
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f, ok := strings.CutSuffix(name, suffix); ok && families[f] {
				family = f
			}
		}
		require.True(t, families[family], "%s: %q names metric %s, which the exporter does not emit", where, expr, name)
	}
	for _, m := range labelName.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1]+","+m[2], ",") {
			if l = strings.TrimSpace(l); l != "" && l != "le" {
				require.True(t, labels[l], "%s: %q uses label %s, which the exporter does not emit", where, expr, l)
			}
		}
	}
}

// Issue 10, item 5: every query of the dashboard and every alert rule
// names only metrics and labels the exporter really emits.
func TestDashboardAndAlertsNameRealMetrics(t *testing.T) {
	t.Parallel()
	families, labels := exported(t)

	raw, err := os.ReadFile("../deploy/grafana/outbox.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Query any } }
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.GreaterOrEqual(t, len(dash.Panels), 6)
	queries := 0
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			checkExpr(t, "panel "+p.Title, q.Expr, families, labels)
			queries++
			// Issue 18, item 7: a relay's panels follow $table, and the
			// table-wide gauges every relay reports are drawn once.
			if !strings.Contains(q.Expr, "messaging_client_consumed") && !strings.Contains(q.Expr, "messaging_process") {
				require.Contains(t, q.Expr, `outbox_table=~"$table"`, "panel %s", p.Title)
			}
			if gauge.MatchString(q.Expr) {
				require.True(t, strings.HasPrefix(q.Expr, "max by (outbox_table)"), "panel %s: %s", p.Title, q.Expr)
			}
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			checkExpr(t, "variable", q, families, labels)
		}
	}

	raw, err = os.ReadFile("../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
				For         string
				Annotations map[string]string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			checkExpr(t, "alert "+r.Alert, r.Expr, families, labels)
			alerts++
		}
	}
	require.GreaterOrEqual(t, alerts, 4)
	// Issue 18, item 7: promtool checks the rules and runs their unit
	// tests (alerts_test.yml: one alert per table however many relays, an
	// alert when every relay is gone). CI installs it and requires it.
	if promtool, err := exec.LookPath("promtool"); err == nil {
		out, err := exec.Command(promtool, "check", "rules", "../deploy/prometheus/alerts.yml").CombinedOutput()
		require.NoError(t, err, "promtool check rules: %s", out)
		cmd := exec.Command(promtool, "test", "rules", "alerts_test.yml")
		cmd.Dir = "../deploy/prometheus"
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, "promtool test rules: %s", out)
	} else if os.Getenv("OUTBOX_REQUIRE_PROMTOOL") == "1" {
		t.Fatal("promtool is not installed (Debian: apt-get install prometheus), and OUTBOX_REQUIRE_PROMTOOL=1")
	} else {
		t.Log("promtool is not installed (Debian: apt-get install prometheus): rules checked by name only")
	}
	for _, want := range []string{"OutboxNoRelay", "InboxDeadLettered"} {
		require.Contains(t, string(raw), "alert: "+want)
	}
	t.Logf("%d dashboard queries and %d alert rules checked against %d exported families", queries, alerts, len(families))
}
