package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// recordingObserver writes down every call.
type recordingObserver struct {
	mu    sync.Mutex
	calls []string
	lags  map[string]time.Duration
}

func (o *recordingObserver) add(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, fmt.Sprintf(format, args...))
}

func (o *recordingObserver) Claimed(_ context.Context, n int, took time.Duration, err error) {
	o.add("claimed %d err=%v positive=%v", n, err != nil, took > 0)
}

func (o *recordingObserver) Published(_ context.Context, n int, took time.Duration) {
	o.add("published %d positive=%v", n, took > 0)
}

func (o *recordingObserver) Lag(_ context.Context, m *outbox.Message, lag time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lags == nil {
		o.lags = map[string]time.Duration{}
	}
	o.lags[m.ID] = lag
}

func (o *recordingObserver) Failed(_ context.Context, m *outbox.Message, class string, parked bool) {
	o.add("failed %s %s parked=%v", m.ID, class, parked)
}

func (o *recordingObserver) Released(_ context.Context, n int, reason string) {
	o.add("released %d %s", n, reason)
}

func (o *recordingObserver) LeasesLost(_ context.Context, n int) { o.add("leases lost %d", n) }

func (o *recordingObserver) Settled(_ context.Context, took time.Duration, err error) {
	o.add("settled err=%v", err)
}

// parkingStore is a fakeStore that parks at the third attempt.
type parkingStore struct{ fakeStore }

func (*parkingStore) MaxAttempts() int { return 3 }

// Issue 10, item 1: the observer sees claims, publishes with every
// message's lag, failures with their class and whether they parked,
// releases with their reason, lost leases and settles.
func TestObserverSeesEverything(t *testing.T) {
	t.Parallel()
	store := &parkingStore{}
	store.lost = map[string]bool{"lost": true}
	created := time.Now().Add(-time.Minute)
	batch := []outbox.Message{
		{ID: "ok", CreatedAt: created}, {ID: "lost", CreatedAt: created},
		{ID: "unroutable", Attempts: 0}, {ID: "last-try", Attempts: 2},
		{ID: "down"}, {ID: "custom"},
	}
	store.push(batch...)
	pub := PublisherFunc(func(ctx context.Context, m []outbox.Message) []error {
		return []error{nil, nil,
			messageFault("unroutable", ClassUnroutable, "no queue"),
			messageFault("last-try", ClassMissingExchange, "no exchange"),
			brokerFault("down", ClassConnection, "connection lost", nil),
			errors.New("a publisher of its own"),
		}
	})
	obs := &recordingObserver{}
	r := newTestRelay(t, store, pub, &Config{Observer: obs})
	_, err := r.runOnce(context.Background())
	require.NoError(t, err)
	_, err = r.runOnce(context.Background()) // nothing left
	require.NoError(t, err)

	require.Equal(t, []string{
		"claimed 6 err=false positive=true",
		"published 2 positive=true",
		"leases lost 1",
		"failed unroutable unroutable parked=false",
		"failed last-try missing_exchange parked=true",
		"failed custom other parked=false",
		"released 1 broker",
		"settled err=<nil>",
		"claimed 0 err=false positive=true",
	}, obs.calls)
	require.Len(t, obs.lags, 2)
	require.InDelta(t, time.Minute.Seconds(), obs.lags["ok"].Seconds(), 5)

	// A nil Observer in Config, even typed, is no observer.
	_, err = New(store, pub, &Config{Observer: (*recordingObserver)(nil)})
	require.NoError(t, err)
}
