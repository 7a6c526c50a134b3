package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// Issue 43: one group relays several tables through one publisher whose
// connections they share (two here, for three tables of four batches in
// flight each): a backlog on one table and a few messages on another are
// all delivered, a table added while the group runs is relayed at once,
// one taken out is no longer relayed, and a table dropped under the group
// fails alone: Health names it, the others go on.
func TestGroupRelaysTablesThatComeAndGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, c := setup(t, nil), setup(t, nil), setup(t, nil)
	a.write(t, 2000, 100, small)
	b.write(t, 50, 10, small)

	g, err := relay.NewGroup(newPublisher(t, &relay.AMQPConfig{MaxConnections: 2}),
		&relay.GroupConfig{Config: relay.Config{PollInterval: 20 * time.Millisecond, Logger: dbtest.Logger(t)}})
	require.NoError(t, err)
	require.NoError(t, g.Add(relay.Table{Name: "a", Store: a.store}))
	require.NoError(t, g.Add(relay.Table{Name: "b", Store: b.store}))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool { return a.consumer.Distinct() == 2000 && b.consumer.Distinct() == 50 }, time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool { st := g.Stats(); return st["a"].Published == 2000 && st["b"].Published == 50 }, time.Minute, 10*time.Millisecond,
		"each table's relay marks what it published")

	require.NoError(t, g.Add(relay.Table{Name: "c", Store: c.store}))
	require.Equal(t, []string{"a", "b", "c"}, g.Tables())
	c.write(t, 30, 10, small)
	require.Eventually(t, func() bool { return c.consumer.Distinct() == 30 }, time.Minute, 10*time.Millisecond, "a table added while the group runs")

	require.True(t, g.Remove("b"))
	b.write(t, 10, 10, small)
	c.write(t, 10, 10, small)
	require.Eventually(t, func() bool { return c.consumer.Distinct() == 40 }, time.Minute, 10*time.Millisecond)
	require.EqualValues(t, 10, b.pending(t), "a table taken out of the group is not relayed")

	_, err = a.db.ExecContext(ctx, `DROP TABLE "`+a.store.Table()+`" CASCADE`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { h := g.Health()["a"]; return h.Err != nil && h.Permanent }, time.Minute, 10*time.Millisecond,
		"the dropped table's relay says it fails, and that waiting will not cure it")
	c.write(t, 10, 10, small)
	require.Eventually(t, func() bool { return c.consumer.Distinct() == 50 }, time.Minute, 10*time.Millisecond, "the others go on")
	require.NoError(t, g.Health()["c"].Err)
	require.Equal(t, 2000, a.consumer.Total(), "no duplicates in a run without faults")
	require.Equal(t, 50, c.consumer.Total())
}
