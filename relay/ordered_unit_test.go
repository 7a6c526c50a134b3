package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// orderedStore is a fakeStore in ordered mode.
type orderedStore struct{ *fakeStore }

func (orderedStore) Ordering() outbox.Ordering { return outbox.OrderedByKey }

// TestOrderedPublishRounds: in ordered mode a key's messages go to the
// publisher one round after another, each round only after the one before
// was confirmed; a key whose message failed has the rest held back and
// released, with "order" as the reason, while other keys go on.
func TestOrderedPublishRounds(t *testing.T) {
	t.Parallel()
	store := orderedStore{&fakeStore{}}
	batch := []outbox.Message{
		{ID: "a1", Key: "a"}, {ID: "b1", Key: "b"}, {ID: "free"}, {ID: "a2", Key: "a"},
		{ID: "b2", Key: "b"}, {ID: "a3", Key: "a"}, {ID: "b3", Key: "b"}, {ID: "a4", Key: "a"},
	}
	store.push(batch...)
	var (
		mu     sync.Mutex
		rounds []string
	)
	pub := PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		mu.Lock()
		rounds = append(rounds, join(msgs))
		mu.Unlock()
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if m.ID == "b2" {
				errs[i] = &PublishError{ID: m.ID, Reason: "NO_ROUTE", Class: ClassUnroutable}
			}
		}
		return errs
	})
	obs := &recordingObserver{}
	r := newTestRelay(t, store, pub, &Config{Observer: obs})
	res, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.brokerFaults, "a held-back message is not a broker fault")
	require.Equal(t, []string{"a1,b1,free", "a2,b2", "a3", "a4"}, rounds)
	require.Equal(t, []string{
		"claim a1,b1,free,a2,b2,a3,b3,a4",
		"published a1,b1,free,a2,a3,a4",
		"failed(NO_ROUTE) b2",
		"release b3",
	}, store.log())
	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Contains(t, obs.calls, "released 1 order")
	require.Contains(t, obs.calls, "failed b2 unroutable parked=false")
}

// TestOrderedBrokerFaultEndsRounds: a broker fault in a round ends the
// rounds; what was not confirmed is released, the broker's share as a
// broker fault, the rest as held back.
func TestOrderedBrokerFaultEndsRounds(t *testing.T) {
	t.Parallel()
	store := orderedStore{&fakeStore{}}
	store.push(outbox.Message{ID: "a1", Key: "a"}, outbox.Message{ID: "b1", Key: "b"}, outbox.Message{ID: "a2", Key: "a"}, outbox.Message{ID: "b2", Key: "b"})
	var rounds []string
	pub := PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		rounds = append(rounds, join(msgs))
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if m.ID == "a1" {
				errs[i] = fmt.Errorf("%w: connection closed", ErrBrokerUnavailable)
			}
		}
		return errs
	})
	r := newTestRelay(t, store, pub, nil)
	res, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.brokerFaults)
	require.Equal(t, []string{"a1,b1"}, rounds)
	require.Equal(t, []string{"claim a1,b1,a2,b2", "published b1", "release a1", "release a2,b2"}, store.log())
}

// TestOrderedTimeoutEndsRounds: when PublishTimeout runs out between
// rounds, the messages never sent are released as held back, not as a
// broker fault: the broker answered every round it was given.
func TestOrderedTimeoutEndsRounds(t *testing.T) {
	t.Parallel()
	store := orderedStore{&fakeStore{}}
	store.push(outbox.Message{ID: "a1", Key: "a"}, outbox.Message{ID: "a2", Key: "a"}, outbox.Message{ID: "a3", Key: "a"})
	var rounds []string
	pub := PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		rounds = append(rounds, join(msgs))
		<-ctx.Done() // the round is confirmed just as the time runs out
		return make([]error, len(msgs))
	})
	r := newTestRelay(t, store, pub, &Config{PublishTimeout: 20 * time.Millisecond})
	res, err := r.runOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.brokerFaults)
	require.Equal(t, []string{"a1"}, rounds)
	require.Equal(t, []string{"claim a1,a2,a3", "published a1", "release a2,a3"}, store.log())
}
