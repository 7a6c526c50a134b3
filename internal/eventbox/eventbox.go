// Package eventbox holds events until the first write that takes them. The
// ORM adapters keep one in a context (entoutbox.WithEvents) or in a
// statement's settings (gormoutbox.Attach); every context or session derived
// from it shares the same box, so its events are written once, by whichever
// write comes first.
package eventbox

import (
	"sync"

	"github.com/acemq/outbox"
)

// Box holds events. A nil *Box is empty. A Box is safe for concurrent use.
type Box struct {
	mu     sync.Mutex
	events []outbox.Event
	parent *Box // events attached earlier, to the context or chain this one extends
}

// New returns a box with evts that, when taken, first takes parent's events.
func New(parent *Box, evts []outbox.Event) *Box {
	return &Box{events: evts, parent: parent}
}

// Take returns the events of the box and of its parents, oldest first, and
// empties them all.
func (b *Box) Take() []outbox.Event {
	if b == nil {
		return nil
	}
	evts := b.parent.Take()
	b.mu.Lock()
	defer b.mu.Unlock()
	evts = append(evts, b.events...)
	b.events = nil
	return evts
}

// GiveBack returns taken events to the box, for a write that did not happen.
func (b *Box) GiveBack(evts []outbox.Event) {
	if b == nil || len(evts) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(evts, b.events...)
}

// Pending reports whether the box or one of its parents holds events.
func (b *Box) Pending() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	n := len(b.events)
	b.mu.Unlock()
	return n > 0 || b.parent.Pending()
}
