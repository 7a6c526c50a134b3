package amqpdial

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Named gives another connection name to the same nodes and leaves the
// dialer it came from as it was.
func TestNamedLeavesTheOriginal(t *testing.T) {
	d, err := New("test", "URLs", Config{URLs: []string{"amqp://u:s3cret@h1:5672/", "amqp://u:s3cret@h2:5673/v"}, Name: "a"})
	require.NoError(t, err)
	n := d.Named("b")
	require.Equal(t, "b", n.cfg.Name)
	require.Equal(t, "a", d.cfg.Name)
	require.Equal(t, d.Nodes(), n.Nodes())
	require.Equal(t, "amqp://h2:5673/v", n.Display(1))
	require.Equal(t, "xxxxx", n.Redact("s3cret"))
}
