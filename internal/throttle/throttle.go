// Package throttle lets one log line of each kind through per interval and
// counts the others, so that a failure that repeats a thousand times a
// second is one line every few seconds with its count.
package throttle

import (
	"sync"
	"time"
)

// Throttle is safe for concurrent use. The zero value lets everything
// through; set Every.
type Throttle struct {
	Every time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

// Allow reports whether a line of kind may be logged now, and how many were
// held back since the last one that was.
func (t *Throttle) Allow(kind string, now time.Time) (bool, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last, t.held = map[string]time.Time{}, map[string]int{}
	}
	if last, ok := t.last[kind]; ok && now.Sub(last) < t.Every {
		t.held[kind]++
		return false, 0
	}
	n := t.held[kind]
	t.last[kind], t.held[kind] = now, 0
	return true, n
}
