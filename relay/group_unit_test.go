package relay

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 43: a group's idle tables together claim about
// GroupConfig.IdleClaims times a second, however many there are: 200 idle
// tables of a 10ms PollInterval would claim 20,000 times a second, each
// on its own; in a group bounded to 400 they claim about that many.
func TestGroupBoundsIdleClaims(t *testing.T) {
	t.Parallel()
	const tables = 200
	g, err := NewGroup(PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) }),
		&GroupConfig{Config: Config{PollInterval: 10 * time.Millisecond, Logger: dbtest.Logger(t)}, IdleClaims: 400})
	require.NoError(t, err)
	stores := make([]*fakeStore, tables)
	for i := range stores {
		stores[i] = &fakeStore{}
		require.NoError(t, g.Add(Table{Name: fmt.Sprintf("t%03d", i), Store: stores[i]}))
	}
	claims := func() (n int) {
		for _, s := range stores {
			n += s.claimCount()
		}
		return n
	}
	// Each table's relay records the longest wait its claimer asked for.
	longest := make([]atomic.Int64, tables)
	for i, s := range stores {
		for _, m := range g.members {
			if m.r.store == s {
				m.r.sleepHook = func(d time.Duration, _ bool) woken {
					if int64(d) > longest[i].Load() {
						longest[i].Store(int64(d))
					}
					time.Sleep(d)
					return notWoken
				}
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	// Each table's waits double from 3ms to their longest, 50 ×
	// PollInterval; then claims are counted for 2s.
	require.Equal(t, 500*time.Millisecond, g.IdlePollInterval())
	require.Eventually(t, func() bool {
		for i := range longest {
			if time.Duration(longest[i].Load()) < g.IdlePollInterval() {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "every table's waits grow to 50 × PollInterval")
	first := claims()
	time.Sleep(2 * time.Second)
	perSecond := float64(claims()-first) / 2
	cancel()
	require.NoError(t, <-done)
	require.LessOrEqual(t, perSecond, 800.0, "claims a second of %d idle tables, bounded to about 400", tables)
	for i := range longest {
		require.LessOrEqual(t, time.Duration(longest[i].Load()), g.IdlePollInterval(), "table %d waited longer than the group allows", i)
	}

	// The bound follows the tables: with two left, each claims every
	// PollInterval again.
	require.Len(t, g.Tables(), tables)
	for _, name := range g.Tables()[2:] {
		require.True(t, g.Remove(name))
	}
	require.Equal(t, 10*time.Millisecond, g.IdlePollInterval())
	for _, m := range g.members {
		require.EqualValues(t, 1, m.r.idleScale.Load())
	}
}

// Issue 43: a table's relay that stops on an error it cannot recover from
// leaves the others running, and Health names it; when every table's has,
// Run returns their errors. Misuse is an error, never a panic.
func TestGroupTableThatStopsLeavesTheOthers(t *testing.T) {
	t.Parallel()
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) })
	_, err := NewGroup(nil, nil)
	require.Error(t, err)
	_, err = NewGroup(pub, &GroupConfig{Config: Config{Wakeup: make(chan struct{})}})
	require.ErrorContains(t, err, "Table.Wakeup")
	_, err = NewGroup(pub, &GroupConfig{IdleClaims: -1})
	require.ErrorContains(t, err, "IdleClaims")

	g, err := NewGroup(pub, &GroupConfig{Config: Config{Logger: dbtest.Logger(t)}})
	require.NoError(t, err)
	require.ErrorContains(t, g.Add(Table{Store: &fakeStore{}}), "no name")
	require.Error(t, g.Add(Table{Name: "nil"}))
	good, bad := &fakeStore{}, &invalidStore{}
	require.NoError(t, g.Add(Table{Name: "good", Store: good}))
	require.NoError(t, g.Add(Table{Name: "bad", Store: bad}))
	require.ErrorContains(t, g.Add(Table{Name: "good", Store: good}), "already")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool { return g.Health()["bad"].Err != nil }, 10*time.Second, 5*time.Millisecond)
	h := g.Health()["bad"]
	require.ErrorIs(t, h.Err, outbox.ErrInvalidTable)
	require.True(t, h.Permanent)
	good.push(outbox.Message{ID: "m1"})
	require.Eventually(t, func() bool { return g.Stats()["good"].Published == 1 }, 10*time.Second, 5*time.Millisecond,
		"the good table relays on")
	require.NoError(t, g.Health()["good"].Err)
	require.ErrorContains(t, g.Run(ctx), "already running")

	require.True(t, g.Remove("good"))
	require.False(t, g.Remove("good"))
	select {
	case err := <-done:
		require.ErrorIs(t, err, outbox.ErrInvalidTable, "every table left has stopped on an error")
		require.ErrorContains(t, err, "bad: ")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when every table had stopped on an error")
	}
}

// invalidStore is a store whose table is not an outbox table.
type invalidStore struct{ fakeStore }

func (s *invalidStore) CheckOrdering(context.Context) error {
	return errors.Join(errors.New("not an outbox table"), outbox.ErrInvalidTable)
}

// Issue 43: an idle relay of a group does not read its table's ordering
// mode before every claim, but it does before it hands on what a claim
// found: a batch claimed unordered from a table that turned ordered while
// the relay was idle is released, without an attempt, and claimed again
// in order, before any of it is published.
func TestGroupIdleRelayRereadsTheModeBeforePublishing(t *testing.T) {
	t.Parallel()
	store := &modeStore{}
	var published []bool // whether each publish's batch was claimed in order
	var mu sync.Mutex
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		mu.Lock()
		defer mu.Unlock()
		published = append(published, store.Ordering() == outbox.OrderedByKey)
		return make([]error, len(m))
	})
	r := newTestRelay(t, store, pub, &Config{PollInterval: 10 * time.Millisecond})
	r.idleScale.Store(10) // as a group of many tables would
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return store.claimCount() >= 2 }, 10*time.Second, 5*time.Millisecond)
	reads := store.reads.Load()
	store.table.Store(true) // outbox convert --to ordered, while the relay idles
	time.Sleep(orderingRefresh + 100*time.Millisecond)
	require.Equal(t, reads, store.reads.Load(), "an idle relay of a group read the mode before claims that found nothing")
	store.push(outbox.Message{ID: "m1"})
	require.Eventually(t, func() bool { return r.Stats().Published == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []bool{true}, published, "published once, claimed in order")
	require.Contains(t, store.log(), "release m1", "the batch claimed unordered was given back")
}

// modeStore is a store whose table's mode (table) the relay reads with
// CheckOrdering; its claims follow the mode read last, and a release puts
// the messages back.
type modeStore struct {
	fakeStore
	table, read atomic.Bool
	reads       atomic.Int64
}

func (s *modeStore) CheckOrdering(context.Context) error {
	s.reads.Add(1)
	s.read.Store(s.table.Load())
	return nil
}

func (s *modeStore) Ordering() outbox.Ordering {
	if s.read.Load() {
		return outbox.OrderedByKey
	}
	return outbox.Unordered
}

func (s *modeStore) Release(ctx context.Context, msgs ...outbox.Message) error {
	err := s.fakeStore.Release(ctx, msgs...)
	s.push(msgs...)
	return err
}

// Issue 43: what a table costs a group in goroutines is what docs/relay.md
// says: about 6 + MaxInFlight (its claimer, settler, publishers, upkeep,
// the group's own for it), not more.
func TestGroupGoroutinesPerTable(t *testing.T) {
	const tables = 50
	g, err := NewGroup(PublisherFunc(func(ctx context.Context, m []outbox.Message) []error { return make([]error, len(m)) }),
		&GroupConfig{Config: Config{Logger: dbtest.Logger(t)}})
	require.NoError(t, err)
	for i := range tables {
		require.NoError(t, g.Add(Table{Name: fmt.Sprintf("t%03d", i), Store: &fakeStore{}}))
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool {
		for _, h := range g.Health() {
			if h.LastClaim.IsZero() {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "every table's relay running")
	perTable := float64(runtime.NumGoroutine()-before) / tables
	cancel()
	require.NoError(t, <-done)
	t.Logf("%.1f goroutines a table (MaxInFlight %d)", perTable, MaxInFlightDefault)
	require.LessOrEqual(t, perTable, float64(6+MaxInFlightDefault))
}
