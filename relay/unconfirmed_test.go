package relay_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/tcpproxy"
	"github.com/acemq/outbox/relay"
)

// Issue 39: what the broker routed and had not confirmed when a connection
// drops is published again. A lane holds at most relay.UnconfirmedMax
// messages unconfirmed, whatever the batch: with the broker's confirms held
// back (a broker slow to confirm, just before it drops the connection), a
// batch of 600 sends no more than that, and the rest is released unsent.
// Before the bound every message of the batch reached the queue, and a
// connection lost then made them all duplicates.
func TestUnconfirmedMessagesAreBounded(t *testing.T) {
	t.Parallel()
	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	u, err := url.Parse(amqptest.URL())
	require.NoError(t, err)
	proxy, err := tcpproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(proxy.Addr().Port))
	pub := newPublisher(t, &relay.AMQPConfig{URL: u.String()})

	batch := func(n int) []outbox.Message {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{ID: fmt.Sprintf("%s-%d-%d", top.Queue, n, i), Exchange: top.Exchange, RoutingKey: "k", Payload: []byte("{}")}
		}
		return msgs
	}
	for _, err := range pub.Publish(context.Background(), batch(1)) {
		require.NoError(t, err) // connected, and confirmed
	}
	require.Equal(t, 1, proxy.Hold(), "the publisher's connection is held: the broker's confirms no longer reach it")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	const n = 600
	errs := pub.Publish(ctx, batch(n))
	require.Len(t, errs, n)
	for _, err := range errs {
		var pe *relay.PublishError
		require.ErrorAs(t, err, &pe)
		require.True(t, pe.BrokerFault, "no confirm: a broker fault, released without an attempt: %v", err)
	}
	routed := func() int {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(top.Queue, false, false, false, false, nil)
		require.NoError(t, err)
		return q.Messages
	}
	// The broker routes every publish it received: 1 + UnconfirmedMax,
	// never more.
	require.Eventually(t, func() bool { return routed() == 1+relay.UnconfirmedMax }, 10*time.Second, 10*time.Millisecond)
	require.Never(t, func() bool { return routed() > 1+relay.UnconfirmedMax }, time.Second, 50*time.Millisecond,
		"a lane published more than %d messages without their confirms", relay.UnconfirmedMax)
}
