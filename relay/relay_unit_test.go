package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/syncbuf"
)

// fakeStore hands out queued batches and records every call in order.
type fakeStore struct {
	checkCtx bool // settles fail on a context that has ended, as a database's do
	mu       sync.Mutex
	batches  [][]outbox.Message
	calls    []string
	lost     map[string]bool
	claims   int
}

func (s *fakeStore) push(msgs ...outbox.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, msgs)
}

func (s *fakeStore) Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims++
	if len(s.batches) == 0 {
		return nil, nil
	}
	b := s.batches[0]
	s.batches = s.batches[1:]
	s.calls = append(s.calls, "claim "+join(b))
	return b, nil
}

func (s *fakeStore) fence(ctx context.Context, op string, msgs []outbox.Message) error {
	if s.checkCtx && ctx.Err() != nil {
		return ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, op+" "+join(msgs))
	var lost []string
	for _, m := range msgs {
		if s.lost[m.ID] {
			lost = append(lost, m.ID)
		}
	}
	if lost != nil {
		return &outbox.LeaseLostError{IDs: lost}
	}
	return nil
}

func (s *fakeStore) MarkPublished(ctx context.Context, msgs ...outbox.Message) error {
	return s.fence(ctx, "published", msgs)
}

func (s *fakeStore) MarkFailed(ctx context.Context, m outbox.Message, reason string) error {
	return s.fence(ctx, "failed("+reason+")", []outbox.Message{m})
}

func (s *fakeStore) Release(ctx context.Context, msgs ...outbox.Message) error {
	return s.fence(ctx, "release", msgs)
}

// The rest of Store: an unordered store that does nothing else.
func (s *fakeStore) Ordering() outbox.Ordering                                    { return outbox.Unordered }
func (s *fakeStore) MaxAttempts() int                                             { return 0 }
func (s *fakeStore) CheckOrdering(context.Context) error                          { return nil }
func (s *fakeStore) Subscribe() (<-chan struct{}, func())                         { return nil, nil }
func (s *fakeStore) Reconcile(context.Context) (held, unheld int64, err error)    { return 0, 0, nil }
func (s *fakeStore) PurgePublished(context.Context, time.Duration) (int64, error) { return 0, nil }
func (s *fakeStore) Maintain(context.Context) error                               { return nil }

func (s *fakeStore) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *fakeStore) claimCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims
}

func join(msgs []outbox.Message) string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return strings.Join(ids, ",")
}

func msgs(ids ...string) []outbox.Message {
	out := make([]outbox.Message, len(ids))
	for i, id := range ids {
		out[i] = outbox.Message{ID: id}
	}
	return out
}

// newTestRelay returns a relay with one lane unless cfg asks for more, so
// that tests of the loop see one sequence of claims and waits.
func newTestRelay(t *testing.T, store Store, pub Publisher, cfg *Config) *Relay {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	cfg.Logger = dbtest.Logger(t)
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1
	}
	r, err := New(store, pub, cfg)
	require.NoError(t, err)
	return r
}

func TestRunOnceSettlesInOrder(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a", "b", "c", "d", "e")...)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		return []error{
			nil,
			messageFault("b", ClassUnroutable, "unroutable"),
			brokerFault("c", ClassConnection, "connection lost", nil),
			nil,
			errors.New("custom publisher failure"),
		}
	})
	r := newTestRelay(t, store, pub, &Config{BatchSize: 5})
	res, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.brokerFaults)
	require.EqualError(t, res.brokerErr, "relay: message c not published: connection lost")
	require.Equal(t, []string{
		"claim a,b,c,d,e",
		"published a,d",
		"failed(unroutable) b",
		"failed(custom publisher failure) e",
		"release c",
	}, store.log())
	require.Equal(t, Stats{Batches: 1, Published: 2, Failed: 2, Released: 1}, r.Stats())
}

func TestRunOnceCountsLostLeases(t *testing.T) {
	t.Parallel()
	store := &fakeStore{lost: map[string]bool{"b": true, "c": true}}
	store.push(msgs("a", "b", "c")...)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		return []error{nil, nil, messageFault("c", ClassUnroutable, "nack")}
	})
	r := newTestRelay(t, store, pub, nil)
	_, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"claim a,b,c", "published a,b", "failed(nack) c"}, store.log())
	require.Equal(t, Stats{Batches: 1, Published: 1, Failed: 0, LeasesLost: 2}, r.Stats())
}

func TestRunOnceWrongResultCountReleases(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a", "b")...)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return []error{nil} })
	r := newTestRelay(t, store, pub, nil)
	res, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, res.brokerFaults)
	require.Equal(t, []string{"claim a,b", "release a,b"}, store.log(), "nothing may be marked published on a malformed answer")
}

func TestRunLoopsWithoutSleepingWhileThereIsWork(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	for i := range 2 {
		store.push(msgs(fmt.Sprint(i, "a"), fmt.Sprint(i, "b"))...)
	}
	store.push(msgs("partial")...) // not a full batch: still no sleep after it
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, store, pub, &Config{BatchSize: 2, PollInterval: time.Hour})
	r.pollFirst = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	// With an hour between polls, only a relay that goes on at once after a
	// batch that found work gets through all three.
	require.Eventually(t, func() bool { return r.Stats().Published == 5 }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return store.claimCount() == 4 }, 5*time.Second, 5*time.Millisecond, "the 4th claim finds nothing")
	cancel()
	require.NoError(t, <-done)
}

func TestRunWakesUpOnSignal(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	wake := make(chan struct{}, 1)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, store, pub, &Config{PollInterval: time.Hour, Wakeup: wake})
	r.pollFirst = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return store.claimCount() == 1 }, 5*time.Second, 5*time.Millisecond)
	store.push(msgs("late")...)
	wake <- struct{}{}
	require.Eventually(t, func() bool { return r.Stats().Published == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func TestRunTwiceFails(t *testing.T) {
	t.Parallel()
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, &fakeStore{}, pub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return r.running.Load() }, 5*time.Second, time.Millisecond)
	require.ErrorContains(t, r.Run(ctx), "already running")
	cancel()
	require.NoError(t, <-done, "the first Run is not disturbed")
}

func TestRunShutdownReleasesUnconfirmed(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a", "b")...)
	started := make(chan struct{})
	// A broker that never confirms: the publisher waits for its context.
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		close(started)
		<-ctx.Done()
		errs := make([]error, len(m))
		for i := range m {
			errs[i] = brokerFault(m[i].ID, ClassConnection, "no confirm", ctx.Err())
		}
		return errs
	})
	r := newTestRelay(t, store, pub, &Config{ShutdownTimeout: 50 * time.Millisecond, PublishTimeout: 20 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	<-started
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within ShutdownTimeout of cancellation")
	}
	require.Equal(t, []string{"claim a,b", "release a,b"}, store.log())
}

func TestRunShutdownMarksWhatWasConfirmed(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	store.push(msgs("a", "b")...)
	ctx, cancel := context.WithCancel(context.Background())
	// Shutdown begins while the batch is in flight; its confirms still arrive.
	pub := PublisherFunc(func(pubCtx context.Context, m []outbox.Message) []error {
		cancel()
		require.NoError(t, pubCtx.Err(), "a publish in flight is not cut short by shutdown")
		return make([]error, len(m))
	})
	r := newTestRelay(t, store, pub, nil)
	require.NoError(t, r.Run(ctx))
	require.Equal(t, []string{"claim a,b", "published a,b"}, store.log())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store, pub := &fakeStore{}, PublisherFunc(func(context.Context, []outbox.Message) []error { return nil })
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{BatchSize: -1}, "Config.BatchSize"},
		{Config{Lease: 90 * time.Millisecond}, "Config.Lease must be at least 1s (got 90ms)"}, // issue 18, item 5
		{Config{Lease: time.Second, PublishTimeout: 2 * time.Second}, "Config.PublishTimeout (2s) must be shorter than Config.Lease (1s)"},
		{Config{PollInterval: -time.Second}, "Config.PollInterval"},
		// Issue 47, item 11: 1ns made an idle relay claim 2,400 times a second.
		{Config{PollInterval: time.Nanosecond}, "Config.PollInterval must be at least 1ms (got 1ns): an idle relay claims once per PollInterval"},
		{Config{PollInterval: 999 * time.Microsecond}, "Config.PollInterval must be at least 1ms (got 999µs)"},
		{Config{BackoffMax: time.Millisecond}, "Config.BackoffMax"},
		{Config{PurgeAfter: -time.Second}, "Config.PurgeAfter"},
		{Config{ShutdownTimeout: -time.Second}, "Config.ShutdownTimeout"},
	} {
		_, err := New(store, pub, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := New(nil, pub, nil)
	require.ErrorContains(t, err, "store is nil")
	_, err = New(store, nil, nil)
	require.ErrorContains(t, err, "publisher is nil")
	// Issue 13, D9: typed nils are refused too, instead of panicking in Run.
	_, err = New((*outbox.Store)(nil), pub, nil)
	require.ErrorContains(t, err, "store is nil")
	_, err = New(store, (*AMQPPublisher)(nil), nil)
	require.ErrorContains(t, err, "publisher is nil")
	_, err = New(store, PublisherFunc(nil), nil)
	require.ErrorContains(t, err, "publisher is nil")
	_, err = New(store, pub, &Config{PollInterval: PollIntervalMin})
	require.NoError(t, err, "the floor itself")
	// Issue 9, item 4: a Lease alone is enough; PublishTimeout follows it.
	r, err := New(store, pub, &Config{Lease: 5 * time.Second})
	require.NoError(t, err)
	require.Equal(t, 5*time.Second/3, r.cfg.PublishTimeout)
	r, err = New(store, pub, nil)
	require.NoError(t, err)
	require.Equal(t, PublishTimeoutDefault, r.cfg.PublishTimeout)
	require.Equal(t, BatchSizeDefault, r.cfg.BatchSize)
	require.Equal(t, LeaseDefault, r.cfg.Lease)
}

// purgingStore is a fakeStore that also purges.
type purgingStore struct {
	fakeStore
	purges chan time.Duration
}

func (s *purgingStore) PurgePublished(_ context.Context, olderThan time.Duration) (int64, error) {
	s.purges <- olderThan
	return 7, nil
}

func TestRunPurgesWhenAsked(t *testing.T) {
	t.Parallel()
	store := &purgingStore{purges: make(chan time.Duration, 10)}
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, store, pub, &Config{PurgeAfter: 72 * time.Hour, PurgeInterval: time.Hour, PollInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	select {
	case d := <-store.purges:
		require.Equal(t, 72*time.Hour, d)
	case <-time.After(10 * time.Second):
		t.Fatal("no purge")
	}
	require.Eventually(t, func() bool { return store.claimCount() > 5 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Empty(t, store.purges, "one purge per PurgeInterval, not per poll")
	require.EqualValues(t, 7, r.Stats().Purged)

	// Without PurgeAfter nothing is purged.
	quiet := &purgingStore{purges: make(chan time.Duration, 1)}
	r = newTestRelay(t, quiet, pub, &Config{PollInterval: time.Millisecond})
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return quiet.claimCount() > 5 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Empty(t, quiet.purges)
}

// maintainingStore is a fakeStore whose Maintain fails on the calls
// in fail, and records each call.
type maintainingStore struct {
	fakeStore
	fail  map[int]bool
	calls chan int
	n     atomic.Int64
}

func (s *maintainingStore) Maintain(ctx context.Context) error {
	n := int(s.n.Add(1))
	select {
	case s.calls <- n:
	case <-ctx.Done():
	}
	if s.fail[n] {
		return errors.New("maintenance failed")
	}
	return nil
}

// TestRunMaintainsBeside: a relay calls Store.Maintain beside its claims,
// again after maintainEvery while it succeeds, after the relay's backoff
// (growing with each failure in a row) while it fails, and not after Run
// returns.
func TestRunMaintainsBeside(t *testing.T) {
	t.Parallel()
	store := &maintainingStore{fail: map[int]bool{2: true, 3: true, 4: true}, calls: make(chan int)}
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, store, pub, &Config{PollInterval: time.Millisecond})
	var (
		mu       sync.Mutex
		attempts []int
	)
	r.backoff = func(n int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, n)
		return time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	for want := 1; want <= 6; want++ {
		select {
		case n := <-store.calls:
			require.Equal(t, want, n)
		case <-time.After(10 * time.Second):
			t.Fatalf("no call %d of Maintain in 10s", want)
		}
	}
	require.Eventually(t, func() bool { return store.claimCount() > 5 }, 5*time.Second, time.Millisecond, "claims go on beside")
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	// The claims' own backoffs are not asked for: they never failed.
	require.Equal(t, []int{1, 2, 3}, attempts, "a backoff per failure in a row, and none after a success")
	select {
	case n := <-store.calls:
		t.Fatalf("Maintain called (call %d) after Run returned", n)
	default:
	}
}

// TestRunBacksOff drives the loop through broker faults, a database
// failure, recovery and idleness, recording the waits it asks for instead
// of sleeping.
func TestRunBacksOff(t *testing.T) {
	t.Parallel()
	store := &failingStore{fakeStore: fakeStore{}, failClaims: map[int]bool{5: true}}
	for range 6 {
		store.push(msgs("m")...)
	}
	var calls int
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		calls++
		if calls <= 3 { // the broker is down for three batches
			return []error{brokerFault("m", ClassConnection, "no connection", nil)}
		}
		return []error{nil}
	})
	type wait struct {
		d        time.Duration
		wakeable bool
	}
	var waits []wait
	ctx, cancel := context.WithCancel(context.Background())
	r := newTestRelay(t, store, pub, &Config{BatchSize: 2, PollInterval: 5 * time.Second, BackoffMax: time.Minute, Wakeup: make(chan struct{})})
	r.sleepHook = func(d time.Duration, wakeable bool) woken {
		waits = append(waits, wait{d, wakeable})
		if len(waits) == 7 {
			cancel()
		}
		return notWoken
	}
	require.NoError(t, r.Run(ctx))
	require.Len(t, waits, 7)
	for i, nominal := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		require.GreaterOrEqual(t, waits[i].d, nominal/2, "broker fault %d", i+1)
		require.LessOrEqual(t, waits[i].d, nominal, "broker fault %d", i+1)
		require.False(t, waits[i].wakeable, "a backoff is not cut short by wake-ups")
	}
	// The broker is back: batches that found work are followed by a claim
	// at once, without a wait.
	require.GreaterOrEqual(t, waits[3].d, 50*time.Millisecond, "the database failed: backoff starts over")
	require.LessOrEqual(t, waits[3].d, 100*time.Millisecond)
	require.False(t, waits[3].wakeable)
	// Idle: waits double from pollFirst (up to PollInterval), and wake-ups cut them short.
	require.Equal(t, []wait{{pollFirst, true}, {2 * pollFirst, true}, {4 * pollFirst, true}}, waits[4:])
	require.Equal(t, int64(3), r.Stats().Released)
	require.Equal(t, int64(3), r.Stats().Published)
}

// failingStore fails the claims whose (1-based) number is in failClaims.
type failingStore struct {
	fakeStore
	failClaims map[int]bool
	n          int
	err        error // what a failed claim returns; "connection refused" if nil
}

func (s *failingStore) Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error) {
	s.n++
	if s.failClaims[s.n] {
		if s.err != nil {
			return nil, s.err
		}
		return nil, errors.New("connection refused")
	}
	return s.fakeStore.Claim(ctx, n, lease)
}

// sqlStateError is a database error with a SQLSTATE, as pgx reports them.
type sqlStateError string

func (e sqlStateError) Error() string {
	return "ERROR: relation does not exist (SQLSTATE " + string(e) + ")"
}
func (e sqlStateError) SQLState() string { return string(e) }

// Issue 13, A3: a permanent error shows in Health, and clears once the
// claims work again.
func TestHealthReportsPermanentErrors(t *testing.T) {
	t.Parallel()
	store := &failingStore{failClaims: map[int]bool{1: true, 2: true, 3: true}, err: fmt.Errorf("outbox: claiming from outbox: %w", sqlStateError("42P01"))}
	pub := PublisherFunc(func(_ context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	r := newTestRelay(t, store, pub, nil)
	require.Equal(t, Health{}, r.Health())

	var seen []Health
	var mu sync.Mutex
	r.sleepHook = func(time.Duration, bool) woken {
		mu.Lock()
		seen = append(seen, r.Health())
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return notWoken
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return !r.Health().LastClaim.IsZero() }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(seen), 3)
	for _, h := range seen[:3] {
		require.True(t, h.Permanent)
		require.ErrorContains(t, h.Err, "SQLSTATE 42P01")
		require.True(t, h.LastClaim.IsZero())
	}
	h := r.Health()
	require.NoError(t, h.Err)
	require.False(t, h.Permanent)
	require.WithinDuration(t, time.Now(), h.LastClaim, 5*time.Second)
}

// subscribingStore is a fakeStore that offers wake-ups, as *outbox.Store does.
type subscribingStore struct {
	fakeStore
	wake       chan struct{}
	subscribed atomic.Int32
}

func (s *subscribingStore) Subscribe() (<-chan struct{}, func()) {
	s.subscribed.Add(1)
	return s.wake, func() { s.subscribed.Add(-1) }
}

// Issue 9, item 3: a write in the same process wakes an idle relay at
// once, through the store, without any configuration.
func TestRunWakesOnLocalWrites(t *testing.T) {
	t.Parallel()
	store := &subscribingStore{wake: make(chan struct{}, 1)}
	var published atomic.Int32
	pub := PublisherFunc(func(_ context.Context, m []outbox.Message) []error {
		published.Add(int32(len(m)))
		return make([]error, len(m))
	})
	r := newTestRelay(t, store, pub, &Config{PollInterval: time.Hour})
	r.pollFirst = time.Hour // without a wake-up, nothing happens for an hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return store.claimCount() == 1 && store.subscribed.Load() == 1 }, 5*time.Second, time.Millisecond)

	store.push(msgs("a")...)
	store.wake <- struct{}{}
	require.Eventually(t, func() bool { return published.Load() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Zero(t, store.subscribed.Load(), "Run ends its subscription")
}

// Issue 9, item 2: an idle relay with the defaults stays under 20 claims a
// second, counted on the waits it asks for.
func TestIdleRelayIsCheap(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	r := newTestRelay(t, store, PublisherFunc(func(context.Context, []outbox.Message) []error { return nil }), nil)
	var slept time.Duration
	var n int
	ctx, cancel := context.WithCancel(context.Background())
	r.sleepHook = func(d time.Duration, _ bool) woken {
		slept += d
		if n++; n == 100 {
			cancel()
		}
		return notWoken
	}
	require.NoError(t, r.Run(ctx))
	perSecond := float64(store.claimCount()) / slept.Seconds()
	t.Logf("idle: %d claims over %s of waits: %.1f claims/s", store.claimCount(), slept, perSecond)
	require.LessOrEqual(t, perSecond, 20.0)
	require.Equal(t, PollIntervalDefault, r.cfg.PollInterval)
}

// A wake-up from a writer in this process comes before its commit (Add
// wakes as it inserts): when the claim it starts finds nothing, the
// claimer claims again at once, not pollFirst later, and only then polls
// pollFirst apart. Another wake-up (another process's commit, a settled
// batch) comes after what it announces: no claim is made again at once.
func TestEmptyClaimAfterWakeUpRetriedAtOnce(t *testing.T) {
	t.Parallel()
	type sleep struct {
		d        time.Duration
		claims   int // claims made before this sleep
		wakeable bool
	}
	sleeps := func(t *testing.T, by woken) []sleep {
		store := &fakeStore{}
		r := newTestRelay(t, store, PublisherFunc(publishNothing), &Config{PollInterval: time.Second, Wakeup: make(chan struct{})})
		var got []sleep
		ctx, cancel := context.WithCancel(context.Background())
		r.sleepHook = func(d time.Duration, wakeable bool) woken {
			got = append(got, sleep{d, store.claimCount(), wakeable})
			if len(got) == 5 {
				cancel()
			}
			if len(got) == 2 { // the second wait is cut short by a wake-up
				return by
			}
			return notWoken
		}
		require.NoError(t, r.Run(ctx))
		return got
	}
	require.Equal(t, []sleep{
		{pollFirst, 1, true}, {2 * pollFirst, 2, true}, // idle: waits double
		{pollFirst, 4, true},                       // woken by a writer: a claim, empty, and at once another
		{pollFirst, 5, true}, {pollFirst, 6, true}, // then pollFirst apart for a few waits
	}, sleeps(t, wokenFirst))
	require.Equal(t, []sleep{
		{pollFirst, 1, true}, {2 * pollFirst, 2, true},
		{pollFirst, 3, true}, // woken otherwise: one claim, then pollFirst apart
		{pollFirst, 4, true}, {pollFirst, 5, true},
	}, sleeps(t, wokenOther))
}

// Issue 43: the claims a written event costs. A writer of this process
// wakes the relay; the claim finds its event; the waits then grow from
// pollFirst (a lone relay) or from pollFirst grown by the group's factor,
// up to a quarter of PollInterval (a relay of a large group), without the
// burst of claims pollFirst apart that the wake-up began: it ended when
// its commit was found. A hundred tables writing 5 events a second each
// asked PostgreSQL for about fourteen claims an event before.
func TestClaimsAfterAnEvent(t *testing.T) {
	t.Parallel()
	waits := func(t *testing.T, scale int64) (got []time.Duration, emptyAfter int) {
		store := &fakeStore{}
		r := newTestRelay(t, store, PublisherFunc(func(_ context.Context, m []outbox.Message) []error { return make([]error, len(m)) }),
			&Config{PollInterval: 100 * time.Millisecond})
		r.idleScale.Store(scale)
		r.busy.Store(true) // as after a claim that found messages: the waits are not the idle ones
		ctx, cancel := context.WithCancel(context.Background())
		found := 0
		r.sleepHook = func(d time.Duration, _ bool) woken {
			if found == 0 && len(got) == 0 {
				got = append(got, d)
				store.push(msgs("a")...)
				found = store.claimCount() + 1 // the claim after the wake-up
				return wokenFirst
			}
			got = append(got, d)
			if d >= r.cfg.PollInterval {
				emptyAfter = store.claimCount() - found
				cancel()
			}
			return notWoken
		}
		require.NoError(t, r.Run(ctx))
		return got[1:], emptyAfter
	}
	lone, empty := waits(t, 1)
	require.Equal(t, []time.Duration{pollFirst, pollFirst, 2 * pollFirst, 4 * pollFirst, 8 * pollFirst, 16 * pollFirst, 32 * pollFirst, 100 * time.Millisecond}, lone)
	require.Equal(t, 7, empty, "a lone relay: the waits double from pollFirst")
	grouped, empty := waits(t, 10)
	require.Equal(t, []time.Duration{25 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond}, grouped)
	require.Equal(t, 3, empty, "a relay of a group of ten times IdleClaims × PollInterval tables: from 25ms, a quarter of PollInterval")
}

// publishNothing is a Publisher function for tests that never publish.
func publishNothing(context.Context, []outbox.Message) []error { return nil }

// blockingClaimStore is a fakeStore whose claims wait for unblock, and
// record their context's deadline.
type blockingClaimStore struct {
	*fakeStore
	started  chan struct{}
	unblock  chan struct{}
	once     sync.Once
	deadline time.Time
}

func (s *blockingClaimStore) Claim(ctx context.Context, n int, lease time.Duration) ([]outbox.Message, error) {
	s.mu.Lock()
	s.deadline, _ = ctx.Deadline()
	s.mu.Unlock()
	s.once.Do(func() { close(s.started) })
	select {
	case <-s.unblock:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.fakeStore.Claim(ctx, n, lease)
}

// Issue 21, item 2: no claim outlasts a third of the lease; and a claim in
// flight when the relay stops runs to its end, and its batch is released
// (cut short, it might have committed all the same and left its messages
// claimed until the lease ends: TestClosedPublisherStopsRun in CI).
func TestClaimBoundedAndFinishedAtShutdown(t *testing.T) {
	t.Parallel()
	store := &blockingClaimStore{fakeStore: &fakeStore{}, started: make(chan struct{}), unblock: make(chan struct{})}
	store.push(msgs("a", "b")...)
	r := newTestRelay(t, store, PublisherFunc(publishNothing), &Config{Lease: 30 * time.Second, ShutdownTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := time.Now()
	go func() { done <- r.Run(ctx) }()
	<-store.started
	store.mu.Lock()
	deadline := store.deadline
	store.mu.Unlock()
	require.False(t, deadline.IsZero(), "a claim has a deadline")
	require.LessOrEqual(t, deadline.Sub(before), 10*time.Second+time.Second, "a third of the lease")
	cancel()
	close(store.unblock)
	require.NoError(t, <-done)
	require.Equal(t, []string{"claim a,b", "release a,b"}, store.log())
}

// The settle of a batch claimed in ordered mode wakes an idle claimer:
// the next messages of its keys may be claimable now. A batch claimed
// unordered holds no key back, and a wake-up would only cost a claim.
// Either way the batch's slot is given back. The relay's own idea of the
// mode is left unordered: what counts is how the batch was claimed.
func TestSettleWakesTheClaimerOnlyWhenOrdered(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		store := &fakeStore{}
		r := newTestRelay(t, store, PublisherFunc(publishNothing), nil)
		p := &pipeline{events: make(chan settleEvent, 1), slots: make(chan struct{}, 1), settled: make(chan struct{}, 1)}
		b := &batch{msgs: msgs("a"), publishBy: time.Now().Add(time.Minute), leaseEnd: time.Now().Add(time.Minute), ordered: ordered}
		p.events <- settleEvent{b: b, final: &outcome{b: b, errs: make([]error, 1)}}
		close(p.events)
		r.settler(context.Background(), p, func(err error) { t.Errorf("settling failed: %v", err) })
		require.Equal(t, ordered, len(p.settled) == 1, "ordered=%v: the claimer woken", ordered)
		require.Len(t, p.slots, 1, "ordered=%v: the slot given back", ordered)
		require.Equal(t, int64(1), r.Stats().Published, "ordered=%v", ordered)
	}
}

// probingPublisher is a broker that is down for the first down publishes,
// and to its probes until up is set.
type probingPublisher struct {
	mu        sync.Mutex
	down      int // publishes still to fail
	up        bool
	published int
	probed    []bool // each probe's outcome
}

func (p *probingPublisher) Publish(_ context.Context, m []outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(m))
	if p.down > 0 {
		p.down--
		for i := range errs {
			errs[i] = brokerFault(m[i].ID, ClassConnection, "connection refused", nil)
		}
		return errs
	}
	p.published += len(m)
	return errs
}

func (p *probingPublisher) probe(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probed = append(p.probed, p.up)
	if !p.up {
		return errors.New("connection refused")
	}
	return nil
}

func (p *probingPublisher) Close() error { return nil }

// Issue 47.12: after a broker outage, the relay claims again as soon as the
// broker answers, not when a backoff grown during the outage ends: while
// it backs off it probes, after 250ms at first, doubling to 2s, and the
// backoff ends at the first probe that works. The loop's waits are
// recorded, not slept.
func TestBrokerBackoffEndsWhenTheBrokerAnswers(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	for range 8 {
		store.push(msgs("m")...)
	}
	// Seven batches meet the outage: the seventh backoff is 3.2s to 6.4s.
	// The broker is back after three of its steps.
	pub := &probingPublisher{down: 7}
	var waits, last []time.Duration
	ctx, cancel := context.WithCancel(context.Background())
	r := newTestRelay(t, store, pub, &Config{BackoffMax: time.Hour, PollInterval: time.Hour})
	r.sleepHook = func(d time.Duration, wakeable bool) woken {
		waits = append(waits, d)
		pub.mu.Lock()
		defer pub.mu.Unlock()
		switch {
		case pub.published > 0:
			cancel() // the eighth batch went out
		case pub.down == 0 && !pub.up && !wakeable:
			// A step of the backoff (the claimer's wait after it claimed
			// the seventh batch, which wake-ups may cut short, can come
			// after that batch's publish failed: it is not one).
			last = append(last, d)
			pub.up = len(last) == 3
		}
		return notWoken
	}
	require.NoError(t, r.Run(ctx))
	pub.mu.Lock()
	defer pub.mu.Unlock()
	require.Equal(t, 1, pub.published, "the eighth batch is published once the broker answers")
	require.Equal(t, int64(7), r.Stats().Released)
	require.Equal(t, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}, last,
		"the last backoff ends at the probe after its third step, not after 3.2s or more")
	require.True(t, pub.probed[len(pub.probed)-1], "and the probe that ended it found the broker")
	for _, d := range waits {
		require.LessOrEqual(t, d, probeMax, "no step of a backoff is longer than probeMax: %v", waits)
	}
}

// Issue 39: a settler that fell behind (the early marks of four lanes
// waiting for it) marks each batch's waiting confirms in one settle, not
// one per group: a relay killed then has fewer confirmed messages not yet
// marked. Every mark still comes before its batch's outcome, and marks
// after an outcome wait for it.
func TestSettlerGathersWaitingEarlyMarks(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	r := newTestRelay(t, store, PublisherFunc(publishNothing), nil)
	p := &pipeline{events: make(chan settleEvent, 16), slots: make(chan struct{}, 2), settled: make(chan struct{}, 1)}
	newBatch := func(ids ...string) *batch {
		return &batch{msgs: msgs(ids...), publishBy: time.Now().Add(time.Minute), leaseEnd: time.Now().Add(time.Minute)}
	}
	x, y := newBatch("x1", "x2", "x3"), newBatch("y1", "y2")
	for _, ev := range []settleEvent{
		{b: x, early: []int{0}}, {b: y, early: []int{0}}, {b: x, early: []int{1}}, {b: y, early: []int{1}},
		{b: x, final: &outcome{b: x, errs: make([]error, 3)}},
		{b: y, final: &outcome{b: y, errs: make([]error, 2)}},
	} {
		p.events <- ev
	}
	close(p.events)
	r.settler(context.Background(), p, func(err error) { t.Errorf("settling failed: %v", err) })
	require.Equal(t, []string{"published x1,x2", "published y1,y2", "published x3"}, store.log(),
		"two settles for four groups, then what the outcome adds")
	require.Equal(t, int64(5), r.Stats().Published)
	require.Len(t, p.slots, 2)
}

// Issue 45: a node left read-only by a failover fails every claim until
// the pool has left it; the advice is logged once for those failures, and
// once again for a later episode (after a claim that went through).
func TestPermanentAdviceLoggedOncePerEpisode(t *testing.T) {
	t.Parallel()
	store := &failingStore{
		failClaims: map[int]bool{1: true, 2: true, 3: true, 5: true, 6: true},
		err:        fmt.Errorf("outbox: claiming from outbox: %w", sqlStateError("25006")),
	}
	pub := PublisherFunc(func(_ context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	var logs syncbuf.Buffer
	r, err := New(store, pub, &Config{Logger: dbtest.LoggerTo(t, &logs), MaxInFlight: 1})
	require.NoError(t, err)
	var sleeps atomic.Int32
	r.sleepHook = func(time.Duration, bool) woken {
		sleeps.Add(1)
		time.Sleep(time.Millisecond)
		return notWoken
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return sleeps.Load() >= 8 }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	out := logs.String()
	require.Equal(t, 5, strings.Count(out, "relay: Claiming failed"), out)
	require.Equal(t, 2, strings.Count(out, "hint="), "advice logged once per episode of failures:\n%s", out)
	require.Equal(t, 3, strings.Count(out, "still, with the permanent error advised above"), out)
	require.Equal(t, 5, strings.Count(out, "permanent=true"), out)
}
