package topology_test

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/topology"
)

func cleanup(t *testing.T, exchanges []string, queues []string) {
	t.Cleanup(func() {
		ch, err := amqptest.Conn(t).Channel()
		if err != nil {
			return
		}
		for _, q := range queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		for _, e := range exchanges {
			_ = ch.ExchangeDelete(e, false, false)
		}
	})
}

// Issue 18, item 1: declaring is idempotent, routes what is bound, and
// gives each queue a dead-letter queue that receives what is rejected.
func TestDeclareIdempotentWithDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x, ae, q := amqptest.Name(t, "x"), amqptest.Name(t, "ae"), amqptest.Name(t, "q")
	cleanup(t, []string{x, ae}, []string{q, q + ".dead"})
	top := &topology.Topology{
		Exchanges: []topology.Exchange{{Name: x, AlternateExchange: ae}},
		Queues:    []topology.Queue{{Name: q, Bindings: []topology.Binding{{Exchange: x, Key: "order.#"}}}},
	}
	conn := amqptest.Conn(t)
	require.NoError(t, top.Declare(ctx, conn))
	require.NoError(t, top.Declare(ctx, conn), "a second declaration changes nothing")

	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(ctx, x, "order.placed", true, false, amqp.Publishing{MessageId: "m1", Body: []byte("{}")}))
	d, ok, err := getOne(t, ch, q)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, d.Nack(false, false), "dead-letter it")
	_, ok, err = getOne(t, ch, q+".dead")
	require.NoError(t, err)
	require.True(t, ok, "the dead-letter queue has it")
	_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclarePassive(ae, "fanout", true, false, false, false, nil), "the alternate exchange exists")
}

func getOne(t *testing.T, ch *amqp.Channel, q string) (amqp.Delivery, bool, error) {
	t.Helper()
	var (
		d   amqp.Delivery
		ok  bool
		err error
	)
	require.Eventually(t, func() bool {
		d, ok, err = ch.Get(q, false)
		return ok || err != nil
	}, 10e9, 10e6)
	return d, ok, err
}

// A queue that exists with other settings is refused with the setting
// named and what to do.
func TestDeclareConflictNamesTheSetting(t *testing.T) {
	t.Parallel()
	q := amqptest.Name(t, "q")
	cleanup(t, nil, []string{q, q + ".dead"})
	conn := amqptest.Conn(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(q, true, false, false, false, nil) // classic, no dead letters
	require.NoError(t, err)
	err = (&topology.Topology{Queues: []topology.Queue{{Name: q}}}).Declare(context.Background(), conn)
	require.ErrorContains(t, err, "declaring queue "+q+" (quorum")
	require.ErrorContains(t, err, "inequivalent arg")
	require.ErrorContains(t, err, "it exists with other settings")
}

func TestParseAndValidate(t *testing.T) {
	t.Parallel()
	top, err := topology.Parse(strings.NewReader(`{"exchanges":[{"name":"shop"}],"queues":[{"name":"billing","bindings":[{"exchange":"shop","key":"order.#"}]}]}`))
	require.NoError(t, err)
	steps, err := top.Plan()
	require.NoError(t, err)
	var descs []string
	for _, s := range steps {
		descs = append(descs, s.Desc)
	}
	require.Equal(t, []string{
		"exchange shop (topic, durable)",
		"queue billing.dead (quorum, durable, dead letters of billing)",
		"queue billing (quorum, durable, dead letters to billing.dead)",
		`binding shop -> billing, key "order.#"`,
	}, descs)
	_, err = topology.Parse(strings.NewReader(`{"exchange":[{"name":"shop"}]}`))
	require.ErrorContains(t, err, `unknown field "exchange"`)
	for js, want := range map[string]string{
		`{"exchanges":[{"name":""}]}`:                        "an exchange has no name",
		`{"exchanges":[{"name":"amq.x"}]}`:                   "are the broker's",
		`{"exchanges":[{"name":"x","kind":"tpoic"}]}`:        `kind "tpoic"`,
		`{"queues":[{"name":"q","bindings":[{"key":"a"}]}]}`: "names no exchange",
	} {
		_, err := topology.Parse(strings.NewReader(js))
		require.ErrorContains(t, err, want, js)
	}
}
