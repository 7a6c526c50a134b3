package relay

import (
	"slices"
	"testing"
)

// TestConfirmGroups: confirms are reported in groups of at least
// reportEvery when the publisher is about to wait, all that arrived
// together in one group, the rest at the end; each index once.
func TestConfirmGroups(t *testing.T) {
	t.Parallel()
	var got [][]int
	g := confirmGroups{report: func(ix []int) { got = append(got, slices.Clone(ix)) }}
	seq := func(from, to int) []int {
		var s []int
		for i := from; i < to; i++ {
			s = append(s, i)
		}
		return s
	}
	// A window of 200: 100 confirms arrive together, then the publisher
	// waits; 10 more, a wait (too few to report); 30 more arrive one by
	// one, each awaited; then the rest, together.
	for i := range 100 {
		g.add(i)
	}
	g.waiting()
	for i := 100; i < 110; i++ {
		g.add(i)
	}
	g.waiting()
	for i := 110; i < 140; i++ {
		g.add(i)
		g.waiting()
	}
	for i := 140; i < 200; i++ {
		g.add(i)
	}
	g.end()
	want := [][]int{seq(0, 100), seq(100, 125), seq(125, 200)}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("reports %v, want %v", got, want)
	}

	// Nothing to report to: nothing is gathered.
	quiet := confirmGroups{}
	quiet.add(1)
	quiet.waiting()
	quiet.end()
	if quiet.ready != nil {
		t.Fatalf("gathered %v with no report", quiet.ready)
	}
}
