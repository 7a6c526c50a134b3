package main

import "testing"

// The relay's memory limit holds what its batches may hold at once: the
// batches being published and the one being claimed (twice). Below that,
// a relay of large messages ran its GC back to back (109–128 collections
// for 40 messages of 10 MB, against 5).
func TestRelayMemoryLimitHoldsTheBatchesInFlight(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		batchBytes int64
		inFlight   int
	}{{64 * mib, 4}, {64 * mib, 1}, {mib, 16}, {512 * mib, 8}} {
		live := int64(c.inFlight-1)*c.batchBytes + 2*c.batchBytes
		if got := relayMemoryLimit(c.batchBytes, c.inFlight); got < live+32*mib {
			t.Errorf("relayMemoryLimit(%d, %d) = %d, below the %d its batches may hold, with 32 MiB for the rest", c.batchBytes, c.inFlight, got, live)
		}
	}
	if relayMemoryLimit(64*mib, 8) <= relayMemoryLimit(64*mib, 4) {
		t.Error("the limit does not grow with --max-in-flight")
	}
}
