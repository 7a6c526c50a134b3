package relay

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// concurrentPub is a ConcurrentPublisher whose answer for each batch the
// test decides, and which records how many batches it holds at once.
type concurrentPub struct {
	publish  func(ctx context.Context, m []outbox.Message) []error
	inFlight atomic.Int32
	maxSeen  atomic.Int32
}

func (p *concurrentPub) Publish(ctx context.Context, m []outbox.Message) []error {
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for {
		seen := p.maxSeen.Load()
		if n <= seen || p.maxSeen.CompareAndSwap(seen, n) {
			break
		}
	}
	return p.publish(ctx, m)
}

func (p *concurrentPub) Close() error     { return nil }
func (p *concurrentPub) Concurrent() bool { return true }

// indexOf returns the position of the first call that starts with prefix.
func indexOf(t *testing.T, calls []string, prefix string) int {
	t.Helper()
	for i, c := range calls {
		if strings.HasPrefix(c, prefix) {
			return i
		}
	}
	t.Fatalf("no call %q in %q", prefix, calls)
	return -1
}

// runPipeline runs a relay with two workers until stop is called.
func runPipeline(t *testing.T, store Store, pub Publisher, cfg *Config) (*Relay, func()) {
	t.Helper()
	cfg.MaxInFlight, cfg.BatchSize = 2, 2
	r := newTestRelay(t, store, pub, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(stop)
	return r, stop
}

// Issue 9, item 1: on shutdown with two batches in flight, both wait for
// their confirms up to ShutdownTimeout and are then released without an
// attempt.
func TestPipelineShutdownWithTwoBatchesInFlight(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a1", "a2")...)
	store.push(msgs("b1", "b2")...)
	pub := &concurrentPub{publish: func(ctx context.Context, m []outbox.Message) []error {
		<-ctx.Done() // the broker never confirms
		errs := make([]error, len(m))
		for i := range m {
			errs[i] = brokerFault(m[i].ID, ClassConnection, "no confirm", ctx.Err())
		}
		return errs
	}}
	r, stop := runPipeline(t, store, pub, &Config{ShutdownTimeout: 50 * time.Millisecond})
	require.Eventually(t, func() bool { return pub.inFlight.Load() == 2 }, 5*time.Second, time.Millisecond, "both lanes publish at once")
	stop()
	calls := store.log()
	indexOf(t, calls, "release a1,a2")
	indexOf(t, calls, "release b1,b2")
	require.Equal(t, int64(4), r.Stats().Released)
	require.Zero(t, r.Stats().Failed)
}

// Issue 9, item 1: a lease lost on batch N (marked after its lease ran
// out) costs nothing to batch N+1, which is published and settled
// meanwhile: settles do not wait for the batches claimed before them
// (issue 19; see the package doc for why they need not).
func TestPipelineLeaseLostWhileNextBatchPublishes(t *testing.T) {
	t.Parallel()
	store := &fakeStore{lost: map[string]bool{"a1": true, "a2": true}}
	store.push(msgs("a1", "a2")...)
	store.push(msgs("b1", "b2")...)
	release := make(chan struct{})
	pub := &concurrentPub{publish: func(ctx context.Context, m []outbox.Message) []error {
		if m[0].ID == "a1" {
			<-release // batch N is slow to confirm: its lease runs out
		}
		return make([]error, len(m))
	}}
	r, stop := runPipeline(t, store, pub, &Config{})
	// N+1 is published while N blocks: wait for that, not for its claim
	// (on a loaded machine the claim can come well before the publish).
	require.Eventually(t, func() bool { return pub.maxSeen.Load() == 2 }, 10*time.Second, time.Millisecond)
	close(release)
	require.Eventually(t, func() bool { return r.Stats().Published == 2 && r.Stats().LeasesLost == 2 }, 5*time.Second, time.Millisecond)
	stop()
	calls := store.log()
	require.Less(t, indexOf(t, calls, "published b1,b2"), indexOf(t, calls, "published a1,a2"), "N+1 settled while N awaited its confirms: %q", calls)
	require.Equal(t, int32(2), pub.maxSeen.Load(), "batch N+1 was published while N awaited its confirms")
}

// Issue 9, item 1: a broker fault in batch N while N+1 is claimed releases
// N without an attempt and leaves N+1 to its own fate.
func TestPipelineBrokerFaultInBatchNWhileNextIsClaimed(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a1", "a2")...)
	store.push(msgs("b1", "b2")...)
	claimedNext := make(chan struct{})
	pub := &concurrentPub{publish: func(ctx context.Context, m []outbox.Message) []error {
		if m[0].ID == "a1" {
			<-claimedNext
			return []error{brokerFault("a1", ClassConnection, "channel closed", nil), brokerFault("a2", ClassConnection, "channel closed", nil)}
		}
		close(claimedNext)
		return make([]error, len(m))
	}}
	r, stop := runPipeline(t, store, pub, &Config{BackoffMax: time.Second})
	require.Eventually(t, func() bool { return r.Stats().Released == 2 && r.Stats().Published == 2 }, 5*time.Second, time.Millisecond)
	stop()
	calls := store.log()
	indexOf(t, calls, "release a1,a2")
	indexOf(t, calls, "published b1,b2")
	require.Zero(t, r.Stats().Failed, "a broker fault counts no attempt")
}

// confirmingPub is a ConcurrentPublisher and ConfirmingPublisher whose
// confirms the test drives.
type confirmingPub struct {
	publish func(ctx context.Context, m []outbox.Message, confirmed func([]int)) []error
}

func (p *confirmingPub) Publish(ctx context.Context, m []outbox.Message) []error {
	return p.publish(ctx, m, nil)
}
func (p *confirmingPub) PublishConfirming(ctx context.Context, m []outbox.Message, confirmed func([]int)) []error {
	return p.publish(ctx, m, confirmed)
}
func (p *confirmingPub) Close() error     { return nil }
func (p *confirmingPub) Concurrent() bool { return true }

// Issue 19: what the broker confirmed is marked published while the rest of
// its batch is still being published; the batch's outcome then marks only
// the rest.
func TestConfirmedMessagesMarkedBeforeTheBatchEnds(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a", "b", "c")...)
	release := make(chan struct{})
	pub := &confirmingPub{publish: func(ctx context.Context, m []outbox.Message, confirmed func([]int)) []error {
		require.NotNil(t, confirmed, "the relay asks for confirms as they come")
		confirmed([]int{0, 1})
		<-release // c's confirm is slow
		return make([]error, len(m))
	}}
	r, stop := runPipeline(t, store, pub, &Config{BatchSize: 3})
	require.Eventually(t, func() bool { return slices.Contains(store.log(), "published a,b") }, 5*time.Second, time.Millisecond,
		"a and b are marked while c is awaited")
	close(release)
	require.Eventually(t, func() bool { return r.Stats().Published == 3 }, 5*time.Second, time.Millisecond)
	stop()
	require.Equal(t, []string{"claim a,b,c", "published a,b", "published c"}, store.log()[:3])
}
