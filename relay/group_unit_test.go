package relay

import (
	"context"
	"errors"
	"fmt"
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool { return claims() >= 3*tables }, 10*time.Second, 5*time.Millisecond, "every table claims")
	// Each table's waits double from 3ms to their longest, 50 ×
	// PollInterval (500ms), in about 1.3s; then claims are counted for 2s.
	time.Sleep(1500 * time.Millisecond)
	first := claims()
	time.Sleep(2 * time.Second)
	perSecond := float64(claims()-first) / 2
	cancel()
	require.NoError(t, <-done)
	require.LessOrEqual(t, perSecond, 800.0, "claims a second of %d idle tables, bounded to about 400", tables)

	// The bound follows the tables: with two left, each claims every
	// PollInterval again.
	require.Len(t, g.Tables(), tables)
	for _, name := range g.Tables()[2:] {
		require.True(t, g.Remove(name))
	}
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
