package main

import (
	"testing"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// TestNoWakeupsHidesOnlySubscribe: bench --no-wake hides the store's
// wake-ups from the relay and nothing else, so that an ordered relay keeps
// its rounds and its Reconcile (relay.Store declares them all: a wrapper
// that dropped one would not compile).
func TestNoWakeupsHidesOnlySubscribe(t *testing.T) {
	t.Parallel()
	store, err := outbox.NewStore(nil, &outbox.StoreConfig{Ordering: outbox.OrderedByKey})
	if err != nil {
		t.Fatal(err)
	}
	var s relay.Store = noWakeups{Store: store}
	if ch, _ := s.Subscribe(); ch != nil {
		t.Fatal("still offers wake-ups")
	}
	if s.Ordering() != outbox.OrderedByKey {
		t.Fatal("lost Ordering")
	}
}
