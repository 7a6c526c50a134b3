package main

import (
	"testing"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/relay"
)

// TestNoWakeupsHidesOnlySubscribe: bench --no-wake hides the store's
// wake-ups from the relay and nothing else, so that an ordered relay keeps
// its rounds and its Reconcile.
func TestNoWakeupsHidesOnlySubscribe(t *testing.T) {
	t.Parallel()
	var s any = noWakeups{Store: &outbox.Store{}}
	if _, ok := s.(relay.Subscriber); ok {
		t.Fatal("still a Subscriber")
	}
	if _, ok := s.(interface{ Ordering() outbox.Ordering }); !ok {
		t.Fatal("lost Ordering")
	}
	if _, ok := s.(relay.Reconciler); !ok {
		t.Fatal("lost Reconcile")
	}
}
