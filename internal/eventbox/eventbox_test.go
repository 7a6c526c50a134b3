package eventbox

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

func types(evts []outbox.Event) []string {
	out := []string{}
	for _, e := range evts {
		out = append(out, e.Type)
	}
	return out
}

func TestBox(t *testing.T) {
	t.Parallel()
	var empty *Box
	require.False(t, empty.Pending())
	require.Empty(t, empty.Take())
	empty.GiveBack([]outbox.Event{{Type: "x"}}) // no panic

	parent := New(nil, []outbox.Event{{Type: "a"}})
	child := New(parent, []outbox.Event{{Type: "b"}})
	require.True(t, child.Pending())
	require.Equal(t, []string{"a", "b"}, types(child.Take()), "parents first")
	require.False(t, child.Pending())
	require.False(t, parent.Pending(), "taken once, for every box sharing them")
	require.Empty(t, parent.Take())

	child.GiveBack([]outbox.Event{{Type: "a"}, {Type: "b"}})
	require.True(t, child.Pending())
	require.Equal(t, []string{"a", "b"}, types(child.Take()))
}
