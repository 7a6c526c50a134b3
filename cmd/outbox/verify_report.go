package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// committedRows is what the table holds once the writers are done: the
// events that committed, and per key their ids in commit order.
type committedRows struct {
	ids   map[string]bool
	byKey map[string][]string
}

// readTable reads the scratch table once, after the writers finished.
func (v *verifier) readTable(ctx context.Context) (*committedRows, error) {
	rows, err := v.db.QueryContext(ctx, v.sql.readTable(v.table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	c := &committedRows{ids: map[string]bool{}, byKey: map[string][]string{}}
	for rows.Next() {
		var id, key string
		if err := rows.Scan(&id, &key); err != nil {
			return nil, err
		}
		c.ids[id] = true
		c.byKey[key] = append(c.byKey[key], id)
	}
	return c, rows.Err()
}

func (v *verifier) allArrived(final *committedRows) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for id := range final.ids {
		if _, ok := v.arrived[id]; !ok {
			return false
		}
	}
	return true
}

func (v *verifier) progress(start time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var faults []string
	for _, f := range verifyAllFaults {
		if n := v.faults[f]; n > 0 {
			faults = append(faults, fmt.Sprintf("%s %d", f, n))
		}
	}
	fmt.Fprintf(v.c.stderr, "verify: %4.0fs  written %d (%d rolled back)  arrived %d of %d committed  deliveries %d  faults: %s\n",
		time.Since(start).Seconds(), v.written, v.rolledBack, len(v.arrived), len(v.committed), v.deliveries, orDefault(strings.Join(faults, ", "), "none yet"))
}

// awaitEffects waits until every committed event had its effect, or the
// deadline, and returns the effects per message id.
func (v *verifier) awaitEffects(ctx context.Context, final *committedRows, deadline time.Time) (map[string]int, error) {
	for {
		effects := map[string]int{}
		_, _, count := v.sql.effects(v.table)
		rows, err := v.db.QueryContext(ctx, count)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				rows.Close()
				return nil, err
			}
			effects[id] = n
		}
		rows.Close()
		complete := true
		for id := range final.ids {
			if effects[id] == 0 {
				complete = false
				break
			}
		}
		if complete || time.Now().After(deadline) || ctx.Err() != nil {
			return effects, rows.Err()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report compares what the table holds (the truth about what committed)
// with what arrived and, with the inbox, with the effects applied.
func (v *verifier) report(took time.Duration, final *committedRows, effects map[string]int) *verifyReport {
	v.mu.Lock()
	defer v.mu.Unlock()
	inTable, byKey := final.ids, final.byKey
	rep := &verifyReport{Table: v.table, Exchange: v.exchange, Queue: v.queue, Seconds: math.Round(took.Seconds()*10) / 10, Ordered: v.o.ordered, Layout: v.o.layout,
		Written: v.written, RolledBack: v.rolledBack, Committed: len(inTable), Deliveries: v.deliveries, Faults: v.faults,
		FaultLog: slices.SortedFunc(slices.Values(v.faultLog), func(a, b faultEvent) int { return a.when.Compare(b.when) })}
	var lat []time.Duration
	for id := range inTable {
		a, ok := v.arrived[id]
		if !ok {
			rep.Lost++
			continue
		}
		if c, ok := v.committed[id]; ok {
			lat = append(lat, max(a.Sub(c), 0))
		}
	}
	for id := range v.arrived {
		if !inTable[id] {
			rep.Phantom++
		}
	}
	rep.Duplicates = v.deliveries - len(v.arrived)
	if len(v.dups) > 0 {
		rep.DuplicatesBy = dupsBy(v.dups, rep.FaultLog, v.faults, v.o.lease)
	}
	if v.o.ordered {
		for key, ids := range byKey {
			pos := make(map[string]int, len(ids))
			for i, id := range ids {
				pos[id] = i
			}
			last := -1
			for _, id := range v.firstByKey[key] {
				p, ok := pos[id]
				if !ok {
					continue
				}
				if p < last {
					rep.OrderViolations++
				}
				last = max(last, p)
			}
		}
	}
	if effects != nil {
		ir := &inboxReport{}
		for id, n := range effects {
			ir.Effects += n
			switch {
			case !inTable[id]:
				ir.Phantom++
			case n > 1:
				ir.AppliedMore++
			}
		}
		for id := range inTable {
			if effects[id] == 0 {
				ir.Missing++
			}
		}
		rep.Inbox = ir
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rep.LatencyMs = latencyReport{ms(percentile(lat, 0.5)), ms(percentile(lat, 0.9)), ms(percentile(lat, 0.99)), ms(lat[len(lat)-1])}
	}
	rep.OK = rep.Lost == 0 && rep.Phantom == 0 && rep.OrderViolations == 0 &&
		(rep.Inbox == nil || rep.Inbox.Missing == 0 && rep.Inbox.Phantom == 0 && rep.Inbox.AppliedMore == 0)
	return rep
}

func (v *verifier) print(r *verifyReport) {
	w := v.c.stdout
	mode := "unordered"
	if r.Ordered {
		mode = "ordered by key"
	}
	fmt.Fprintf(w, "verify: %.0fs, %s, %s layout; written %d, rolled back %d, committed %d; %d deliveries\n", r.Seconds, mode, r.Layout, r.Written, r.RolledBack, r.Committed, r.Deliveries)
	fmt.Fprintf(w, "  lost              %d\n  phantom           %d\n  duplicates        %d\n", r.Lost, r.Phantom, r.Duplicates)
	r.DuplicatesBy.print(w)
	if r.Ordered {
		fmt.Fprintf(w, "  order violations  %d\n", r.OrderViolations)
	}
	if r.Inbox != nil {
		fmt.Fprintf(w, "  inbox: %d effects; missing %d, phantom %d, applied more than once %d\n", r.Inbox.Effects, r.Inbox.Missing, r.Inbox.Phantom, r.Inbox.AppliedMore)
	}
	var faults []string
	for _, f := range verifyAllFaults {
		if n, ok := r.Faults[f]; ok || slices.Contains(verifyFaults, f) {
			faults = append(faults, fmt.Sprintf("%s %d", f, n))
		}
	}
	fmt.Fprintf(w, "  faults            %s\n", strings.Join(faults, ", "))
	for _, e := range r.FaultLog {
		n := "unknown (the table could not be read)"
		if e.InFlight != nil {
			n = fmt.Sprint(*e.InFlight)
		}
		fmt.Fprintf(w, "    %-13s at %5.1fs  in flight %s, duplicates %d\n", e.Fault, e.At, n, e.Duplicates)
	}
	if len(r.FaultLog) > 0 {
		fmt.Fprintf(w, "    (in flight: messages claimed by a relay and not yet settled, over all relays, read just before the fault: the messages it could have duplicated)\n")
	}
	fmt.Fprintf(w, "  commit → consume  p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	if r.OK {
		fmt.Fprintln(w, "verify: OK: nothing lost, nothing phantom"+map[bool]string{true: ", every key in order", false: ""}[r.Ordered])
	}
}
