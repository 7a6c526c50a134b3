package relay_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// slowSettle publishes through the real publisher, then dawdles before the
// relay may mark the batch: a process killed now dies holding confirmed
// but unmarked messages, the worst moment for a crash.
type slowSettle struct{ relay.Publisher }

func (p slowSettle) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return p.PublishConfirming(ctx, msgs, nil)
}

// PublishConfirming passes the confirms on as they come (issue 19: the
// relay marks them at once), then dawdles as Publish does.
func (p slowSettle) PublishConfirming(ctx context.Context, msgs []outbox.Message, confirmed func([]int)) []error {
	var errs []error
	if cp, ok := p.Publisher.(relay.ConfirmingPublisher); ok && confirmed != nil {
		errs = cp.PublishConfirming(ctx, msgs, confirmed)
	} else {
		errs = p.Publisher.Publish(ctx, msgs)
	}
	time.Sleep(150 * time.Millisecond)
	return errs
}

// TestHelperRelayProcess is not a test: TestRelayKilledMidBatch runs the
// test binary again with OUTBOX_HELPER_RELAY=1 to get a relay process it can
// kill.
func TestHelperRelayProcess(t *testing.T) {
	if os.Getenv("OUTBOX_HELPER_RELAY") != "1" {
		t.Skip("helper process of TestRelayKilledMidBatch, runs only as its subprocess")
	}
	var db *sql.DB
	cfg := &outbox.StoreConfig{Table: os.Getenv("OUTBOX_HELPER_TABLE"), Logger: dbtest.Logger(t)}
	if dsn := os.Getenv("OUTBOX_HELPER_MYSQL_DSN"); dsn != "" {
		var err error
		db, err = sql.Open("mysql", dsn)
		require.NoError(t, err)
		cfg.Table = ""
		cfg.Router = outbox.ToExchange(os.Getenv("OUTBOX_HELPER_EXCHANGE"))
	} else {
		db = dbtest.NewDB(t)
	}
	if os.Getenv("OUTBOX_HELPER_ORDERED") == "1" {
		cfg.Ordering = outbox.OrderedByKey
	}
	store, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqptest.URL()})
	require.NoError(t, err)
	r, err := relay.New(store, slowSettle{pub}, &relay.Config{BatchSize: 100, Lease: 2 * time.Second, PublishTimeout: time.Second, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	_ = r.Run(context.Background()) // until SIGKILL
}

// startRelayProcess runs a relay on table in a process of its own (the
// test binary again, as TestHelperRelayProcess) and returns a function that
// SIGKILLs it: no shutdown, no release.
func startRelayProcess(t *testing.T, table string, ordered bool) (kill func()) {
	t.Helper()
	env := []string{"OUTBOX_HELPER_TABLE=" + table}
	if ordered {
		env = append(env, "OUTBOX_HELPER_ORDERED=1")
	}
	return startHelperRelay(t, env...)
}

// startHelperRelay runs TestHelperRelayProcess with env added to this
// process's environment, and returns a function that SIGKILLs it.
func startHelperRelay(t *testing.T, env ...string) (kill func()) {
	t.Helper()
	var out dbtest.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(append(os.Environ(), "OUTBOX_HELPER_RELAY=1"), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Kill() // an error: it had already exited, which the test notices
			_ = cmd.Wait()
		})
	}
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("relay process output:\n%s", out.String())
		}
	})
	return kill
}

func TestRelayKilledMidBatch(t *testing.T) { onEveryLayout(t, testRelayKilledMidBatch) }

func testRelayKilledMidBatch(t *testing.T, l outbox.Layout) {
	const n = 3000
	b := setupOn(t, l, nil, nil)
	b.write(t, n, 500, small)

	kill := startRelayProcess(t, b.store.Table(), false)
	require.Eventually(t, func() bool { return b.consumer.Distinct() >= 1000 }, time.Minute, 5*time.Millisecond)
	kill()
	held := b.count(t, "claim_token IS NOT NULL AND published_at IS NULL")
	require.Positive(t, held, "the process died holding a claimed batch")
	delivered := b.consumer.Distinct()
	require.Less(t, delivered, n)

	// Another relay delivers the rest once the dead process's lease expires.
	start(t, b.store, newPublisher(t, nil), &relay.Config{BatchSize: 100, PollInterval: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	requireDelivered(t, b.consumer.IDs(), b.ids(t, "")) // nothing lost
	dups := b.consumer.Total() - b.consumer.Distinct()
	t.Logf("killed after %d of %d delivered, holding %d claimed rows; %d delivered twice (at least once: consumers deduplicate on the message id)",
		delivered, n, held, dups)
	require.LessOrEqual(t, dups, int(held), "only what the dead relay held can be delivered twice")
}
