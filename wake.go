package outbox

import "sync"

// Wake-ups within a process: Add announces that events were written to a
// table, and relays in the same process (relay.Run subscribes through
// Store.Subscribe) claim at once instead of at their next poll. The
// announcement comes when the INSERT is done, before the caller commits;
// a relay that finds nothing yet claims again at once, then every
// millisecond for a few, until the commit is visible.
var wakeups struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // by quoted table name
}

// Subscribe returns a channel that receives a value soon after events are
// written to the store's table in this process (by Add, and so by the ORM
// adapters), and a function that ends the subscription. The channel holds
// one value; wake-ups that arrive while it is full are merged.
func (s *Store) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	if wakeups.subs == nil {
		wakeups.subs = make(map[string]map[chan struct{}]struct{})
	}
	if wakeups.subs[s.t.quoted] == nil {
		wakeups.subs[s.t.quoted] = make(map[chan struct{}]struct{})
	}
	wakeups.subs[s.t.quoted][ch] = struct{}{}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			wakeups.mu.Lock()
			defer wakeups.mu.Unlock()
			delete(wakeups.subs[s.t.quoted], ch)
			if len(wakeups.subs[s.t.quoted]) == 0 {
				delete(wakeups.subs, s.t.quoted)
			}
		})
	}
}

// Notify wakes the subscribers of the store's table in this process. Add
// calls it; call it yourself after writing to the table by other means.
func (s *Store) Notify() {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	for ch := range wakeups.subs[s.t.quoted] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
