package mysqlstore

import (
	"sync/atomic"
	"time"
)

// A claim reads state_idx from a low-water mark rather than from its
// start. A message published leaves a delete-marked entry at the start of
// the waiting rows' range, which InnoDB purges only once no read view can
// see it: while a long REPEATABLE READ transaction is open, every claim
// that read from the start stepped over all the entries of what had been
// published since, and the relay fell from 1,000 messages a second to 105
// (BENCHMARKS.md). The mark is a hint, never a promise: a claim that finds
// its first ready row moves it there; a row below it that becomes ready
// again (its lease ran out, its backoff ended, a release by another
// process) is found by the claim that reads from the start, one a second
// (fullEvery) or, when such a read is slow (the entries it steps over),
// no more than a twentieth of the time (fullShare); or at once when this
// store released it or counted its failure (lower).

// fullEvery is how often a claim reads the waiting rows from their start,
// at most; fullShare the most of the claims' time such reads may take.
const (
	fullEvery = time.Second
	fullShare = 20
)

type lowMark struct {
	seq        atomic.Int64 // claims read rows above it
	fullAt     atomic.Int64 // when a claim (or Maintain) last read from the start, Unix nanoseconds
	fullTook   atomic.Int64 // how long that read took, nanoseconds
	maintainAt atomic.Int64 // when Maintain last ran, Unix nanoseconds
}

// maintained says whether Maintain runs (a relay calls it every 100ms):
// it then does the reads from the start, beside the claims, which never
// wait for one.
func (l *lowMark) maintained() bool {
	return time.Now().UnixNano()-l.maintainAt.Load() < int64(2*time.Second)
}

// due says whether a read from the start is due, and takes it if so.
func (l *lowMark) due() bool {
	now := time.Now().UnixNano()
	every := max(int64(fullEvery), fullShare*l.fullTook.Load())
	at := l.fullAt.Load()
	return now-at >= every && l.fullAt.CompareAndSwap(at, now)
}

// from returns the seq a claim reads from (0: the start, when due and
// Maintain does not run).
func (l *lowMark) from() int64 {
	if l.maintained() {
		return l.seq.Load()
	}
	now := time.Now().UnixNano()
	every := max(int64(fullEvery), fullShare*l.fullTook.Load())
	if at := l.fullAt.Load(); now-at >= every && l.fullAt.CompareAndSwap(at, now) {
		return 0
	}
	return l.seq.Load()
}

// read records how long a claim's read from from took.
func (l *lowMark) read(from int64, took time.Duration) {
	if from == 0 {
		l.fullTook.Store(int64(took))
	}
}

// found records what a claim that read from from found: the rows up to
// after are not ready for the next claim (taken by this one, or not
// ready); after is 0 when it found nothing.
func (l *lowMark) found(from, after int64) {
	if after == 0 {
		if from > 0 && l.fullTook.Load() < int64(fullEvery)/fullShare {
			l.fullAt.Store(0) // nothing above the mark: the next claim reads from the start, when that is cheap
		}
		return
	}
	for {
		cur := l.seq.Load()
		if cur >= after && from > 0 || l.seq.CompareAndSwap(cur, after) {
			return
		}
	}
}

// lower makes the next claim read from seq (a row this store made ready
// again).
func (l *lowMark) lower(seq int64) {
	for {
		cur := l.seq.Load()
		if cur < seq || l.seq.CompareAndSwap(cur, seq) {
			return
		}
	}
}
