package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each duplicate is put down to the first fault that was not over before
// its first delivery and had begun before it came again; a broker's
// redelivery to verify's consumer is the consumer's.
func TestDuplicatesPutDownToTheirFault(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	log := []faultEvent{
		{Fault: "kill", when: at(10), ended: at(10)},
		{Fault: "close-broker", when: at(12), ended: at(13.5)}, // rabbitmqctl: the close came near its end
		{Fault: "kill", when: at(15), ended: at(15)},
	}
	dups := []duplicate{
		{id: "a", first: at(9.9), at: at(16)},                     // confirmed, not marked, when the relay was killed: after the lease
		{id: "b", first: at(13.2), at: at(13.8)},                  // routed, unconfirmed, when the broker closed the connection
		{id: "c", first: at(11), at: at(14)},                      // routed before the close began, unconfirmed at it
		{id: "d", first: at(20), at: at(20.1)},                    // no fault explains it
		{id: "e", first: at(14.9), at: at(21), redelivered: true}, // verify's consumer lost its ack
		{id: "f", first: at(14.8), at: at(14.9)},                  // again before the next fault began: none
	}
	r := dupsBy(dups, log, map[string]int{"kill": 2, "close-broker": 1}, 6*time.Second)
	require.Equal(t, map[string]int{"kill": 1, "close-broker": 2, "none": 2, "consumer": 1}, r.ByFault)
	require.Equal(t, []int{1, 2, 0}, []int{log[0].Duplicates, log[1].Duplicates, log[2].Duplicates})
	require.Equal(t, 0.5, r.PerFault["kill"])
	require.Equal(t, map[string]int{"<1s": 3, "1s-lease": 1, "lease-2xlease": 2}, r.After)
}
