package relay

import (
	"context"
	"reflect"
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
	release, aStarted := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	pub := &concurrentPub{publish: func(ctx context.Context, m []outbox.Message) []error {
		if m[0].ID == "a1" {
			close(aStarted)
			<-release // batch N is slow to confirm: its lease runs out
		}
		return make([]error, len(m))
	}}
	r, stop := runPipeline(t, store, pub, &Config{})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before stop, even if the test fails
	// While N's publish is under way, N+1 is published and settled: its
	// publish may even end before N's begins, so wait for N's start, then
	// for N+1's settle.
	select {
	case <-aStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("batch N was never published")
	}
	require.Eventually(t, func() bool { return slices.Contains(store.log(), "published b1,b2") }, 10*time.Second, time.Millisecond,
		"batch N+1 was published and settled while N awaited its confirms")
	releaseOnce.Do(func() { close(release) })
	require.Eventually(t, func() bool { return r.Stats().Published == 2 && r.Stats().LeasesLost == 2 }, 5*time.Second, time.Millisecond)
	stop()
	calls := store.log()
	require.Less(t, indexOf(t, calls, "published b1,b2"), indexOf(t, calls, "published a1,a2"), "N+1 settled while N awaited its confirms: %q", calls)
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
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before stop, even if the test fails
	require.Eventually(t, func() bool { return slices.Contains(store.log(), "published a,b") }, 5*time.Second, time.Millisecond,
		"a and b are marked while c is awaited")
	releaseOnce.Do(func() { close(release) })
	require.Eventually(t, func() bool { return r.Stats().Published == 3 }, 5*time.Second, time.Millisecond)
	stop()
	require.Equal(t, []string{"claim a,b,c", "published a,b", "published c"}, store.log()[:3])
}

// Issue 19: the claimer claims the next batch while a publisher is free, not
// only after a full claim: a batch of one message is followed by a second
// claim while the first is still being published.
func TestClaimerClaimsWhilePublishCapacityIsFree(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a")...)
	store.push(msgs("b")...)
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	pub := concurrentFunc(func(ctx context.Context, m []outbox.Message) []error {
		n := inFlight.Add(1)
		for {
			old := most.Load()
			if n <= old || most.CompareAndSwap(old, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		return make([]error, len(m))
	})
	// After a short batch the claimer lingers 3ms (pollFirst) before it
	// claims again; it does not wait for the batch to be settled.
	r := newTestRelay(t, store, pub, &Config{MaxInFlight: 2, BatchSize: 100, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return most.Load() == 2 }, 5*time.Second, time.Millisecond,
		"both one-message batches are published side by side")
	close(release)
	require.Eventually(t, func() bool { return r.Stats().Published == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// concurrentFunc is a PublisherFunc that says it may be called concurrently.
type concurrentFunc func(ctx context.Context, msgs []outbox.Message) []error

func (f concurrentFunc) Publish(ctx context.Context, msgs []outbox.Message) []error {
	return f(ctx, msgs)
}
func (concurrentFunc) Close() error     { return nil }
func (concurrentFunc) Concurrent() bool { return true }

// Issue 19: a publish that takes 20s, well within a PublishTimeout of 60s
// and a lease of 2m, is marked published once and never released: the
// settle's deadline comes from the batch's lease, not from a fixed time
// after the claim (it was 15s, and the confirmed batch was published again
// after the lease).
func TestSlowPublishWithinItsTimeoutIsMarkedOnce(t *testing.T) {
	t.Parallel()
	store := &fakeStore{checkCtx: true}
	store.push(msgs("a", "b")...)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		select {
		case <-time.After(20 * time.Second):
		case <-ctx.Done():
			t.Error("the publish was cut short:", ctx.Err())
		}
		return make([]error, len(m))
	})
	r := newTestRelay(t, store, pub, &Config{Lease: 2 * time.Minute, PublishTimeout: time.Minute})
	_, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"claim a,b", "published a,b"}, store.log())
	require.Equal(t, Stats{Batches: 1, Published: 2}, r.Stats())
}

// Issue 19: the seam declares everything the relay uses. A wrapper that
// forwards only the four methods of the work is not a Store (it does not
// compile); one that embeds a Store forwards all, and ordered mode with it.
func TestStoreWrapperCannotLoseOrderedMode(t *testing.T) {
	t.Parallel()
	storeType := reflect.TypeFor[Store]()
	require.False(t, reflect.TypeFor[*workOnly]().Implements(storeType), "a wrapper of the four work methods only is not a Store")
	inner := &fakeStore{}
	inner.push(msgs("a", "b")...)
	wrapped := struct{ Store }{orderedStore{inner}}
	r := newTestRelay(t, wrapped, PublisherFunc(publishNothing), nil)
	b, err := r.claim(context.Background(), context.Background())
	require.NoError(t, err)
	require.True(t, b.ordered, "ordered mode passes through the wrapper: the batch is published in rounds")
}

// workOnly forwards the work and nothing else, as wrappers once did.
type workOnly struct{ s *fakeStore }

func (w *workOnly) Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error) {
	return w.s.Claim(ctx, n, lease)
}
func (w *workOnly) MarkPublished(ctx context.Context, m ...outbox.Message) error {
	return w.s.MarkPublished(ctx, m...)
}
func (w *workOnly) MarkFailed(ctx context.Context, m outbox.Message, reason string) error {
	return w.s.MarkFailed(ctx, m, reason)
}
func (w *workOnly) Release(ctx context.Context, m ...outbox.Message) error {
	return w.s.Release(ctx, m...)
}
