package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// duplicate is a delivery of a message after its first.
type duplicate struct {
	id          string
	first, at   time.Time
	redelivered bool // the broker redelivered it to verify's consumer (an ack lost), the relay did not publish it again
	cause       string
}

// dupReport puts every duplicate down to a cause and says how long after
// the first delivery it came.
type dupReport struct {
	// ByFault counts the duplicates per fault kind: the first fault that
	// was not over before the message's first delivery (less dupSlack)
	// and had begun before its duplicate came, the one that found the
	// message published and not yet marked. "consumer" counts
	// redeliveries to verify's own consumer (its ack was lost), "none"
	// duplicates no fault explains.
	ByFault map[string]int `json:"by_fault"`
	// PerFault is ByFault divided by the faults of that kind injected.
	PerFault map[string]float64 `json:"per_fault"`
	// After counts the duplicates by the time between the first delivery
	// and the duplicate: "<1s", "1s-lease", "lease-2xlease", ">2xlease".
	After map[string]int `json:"after"`
	// MedianAfterMs is the median of that time per fault kind.
	MedianAfterMs map[string]float64 `json:"median_after_ms"`
}

// dupSlack is how long before the fault a duplicate's first delivery may
// come and still be put down to it: a consumer receives a message before
// the relay has its confirm, and the fault's time is read before it is
// injected.
const dupSlack = 500 * time.Millisecond

// dupsBy attributes dups to the faults in log and counts them in each
// fault's Duplicates.
func dupsBy(dups []duplicate, log []faultEvent, counts map[string]int, lease time.Duration) *dupReport {
	byEnd := make([]*faultEvent, len(log))
	for i := range log {
		byEnd[i] = &log[i]
	}
	slices.SortFunc(byEnd, func(a, b *faultEvent) int { return a.ended.Compare(b.ended) })
	r := &dupReport{ByFault: map[string]int{}, PerFault: map[string]float64{}, After: map[string]int{}, MedianAfterMs: map[string]float64{}}
	gaps := map[string][]time.Duration{}
	for k := range dups {
		d := &dups[k]
		cause := "none"
		if d.redelivered {
			cause = "consumer"
		} else if i, _ := slices.BinarySearchFunc(byEnd, d.first.Add(-dupSlack), func(e *faultEvent, t time.Time) int { return e.ended.Compare(t) }); i < len(byEnd) && !byEnd[i].when.After(d.at) {
			cause = byEnd[i].Fault
			byEnd[i].Duplicates++
		}
		r.ByFault[cause]++
		d.cause = cause
		gap := d.at.Sub(d.first)
		gaps[cause] = append(gaps[cause], gap)
		switch {
		case gap < time.Second:
			r.After["<1s"]++
		case gap < lease:
			r.After["1s-lease"]++
		case gap < 2*lease:
			r.After["lease-2xlease"]++
		default:
			r.After[">2xlease"]++
		}
	}
	for f, n := range r.ByFault {
		if c := counts[f]; c > 0 {
			r.PerFault[f] = math.Round(float64(n)/float64(c)*10) / 10
		}
		g := gaps[f]
		slices.Sort(g)
		r.MedianAfterMs[f] = ms(percentile(g, 0.5))
	}
	return r
}

// print writes the attribution under the duplicates' line.
func (r *dupReport) print(w io.Writer) {
	if r == nil || len(r.ByFault) == 0 {
		return
	}
	var by []string
	for _, f := range slices.Sorted(maps.Keys(r.ByFault)) {
		s := fmt.Sprintf("%s %d", f, r.ByFault[f])
		if pf, ok := r.PerFault[f]; ok {
			s += fmt.Sprintf(" (%.1f per fault)", pf)
		}
		s += fmt.Sprintf(" after %.0f ms", r.MedianAfterMs[f])
		by = append(by, s)
	}
	fmt.Fprintf(w, "    by fault        %s\n", strings.Join(by, "; "))
	fmt.Fprintf(w, "    came again      <1s %d, 1s to the lease %d, lease to 2×lease %d, later %d\n",
		r.After["<1s"], r.After["1s-lease"], r.After["lease-2xlease"], r.After[">2xlease"])
}

// writeDupsCSV writes every duplicate, one line each, with the wall times
// (UTC, as the relays log them) of its first delivery and of this one.
func (v *verifier) writeDupsCSV(path string, log []faultEvent) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"message_id", "first", "again", "redelivered", "fault"})
	v.mu.Lock()
	for _, d := range v.dups {
		_ = w.Write([]string{d.id, d.first.UTC().Format(time.RFC3339Nano), d.at.UTC().Format(time.RFC3339Nano),
			fmt.Sprint(d.redelivered), d.cause})
	}
	v.mu.Unlock()
	w.Flush()
	return errors.Join(w.Error(), f.Close())
}
