package relay_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// blackHole listens on a free local port and accepts connections that it
// never answers, as a broker that hangs (or a network that drops its
// replies) does, until the test ends. accepted counts them.
func blackHole(t *testing.T) (url string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted = &atomic.Int32{}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "amqp://guest:guest@" + ln.Addr().String() + "/", accepted
}

// Issue 47, item 12: a shutdown while the publisher dials a broker that
// accepts the connection and never answers does not wait out the dial
// timeout (10s) nor ShutdownTimeout (10s): nothing was sent, so no confirm
// is awaited, and the claimed messages are released at once.
func TestShutdownWhileDialingABlackHoledBroker(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	url, accepted := blackHole(t)
	pub := newPublisher(t, &relay.AMQPConfig{URL: url})                                        // DialTimeoutDefault
	r, err := relay.New(b.store, pub, &relay.Config{Logger: dbtest.Logger(t), MaxInFlight: 1}) // ShutdownTimeoutDefault
	require.NoError(t, err)
	b.write(t, 5, 5, small)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return accepted.Load() > 0 }, 10*time.Second, time.Millisecond,
		"the relay claims the messages and dials the broker")

	cancel()
	// Generous, and well short of the 10s that either the dial timeout or
	// the shutdown timeout would take.
	const bound = 5 * time.Second
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(bound):
		t.Fatalf("Run still running %s after its context ended: the dial holds up the shutdown", bound)
	}
	require.EqualValues(t, 5, r.Stats().Released, "the claimed messages are given back")
	require.EqualValues(t, 5, b.pending(t))
	require.EqualValues(t, 0, b.count(t, "attempts > 0"), "a shutdown burns no attempts")
}

// TestProbeTellsWhetherTheBrokerAnswers: the probe the relay makes while
// it backs off after a broker fault fails while the broker does not answer
// (bounded by its context), and works once it does, leaving the
// connection it opened to the next publish.
func TestProbeTellsWhetherTheBrokerAnswers(t *testing.T) {
	t.Parallel()
	proxy := amqptest.NewProxy(t)
	pub := newPublisher(t, &relay.AMQPConfig{URL: proxy.URL()})
	proxy.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.Error(t, relay.Probe(ctx, pub), "a broker that does not answer")
	proxy.Unstall()
	require.NoError(t, relay.Probe(context.Background(), pub), "the broker answers again")
	require.NoError(t, pub.Check(context.Background()), "and left its connection open")
	require.NoError(t, pub.Close())
	require.ErrorIs(t, relay.Probe(context.Background(), pub), relay.ErrPublisherClosed)
}
