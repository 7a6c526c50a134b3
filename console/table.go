package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/acemq/outbox"
)

// ChartMinutes is how far back a table's chart of published messages
// goes, a bar a minute.
const ChartMinutes = 60

// bar is one minute of the chart, drawn in the page's SVG.
type bar struct {
	X, Y, W, H float64
	Title      string
}

// chart is the published messages per second of each of the last
// minutes, oldest on the left, scaled to the busiest.
type chart struct {
	Bars        []bar
	Peak, Now   float64 // messages a second: the busiest minute's, the last minute's
	Width, Tall float64
}

func newChart(byMinute []int64) chart {
	const width, tall = 600.0, 120.0
	c := chart{Width: width, Tall: tall}
	for _, n := range byMinute {
		c.Peak = max(c.Peak, float64(n)/60)
	}
	if len(byMinute) > 0 {
		c.Now = float64(byMinute[0]) / 60
	}
	w := width / float64(len(byMinute))
	for i := range byMinute {
		ago := len(byMinute) - 1 - i // oldest on the left
		rate := float64(byMinute[ago]) / 60
		h := 0.0
		if c.Peak > 0 {
			h = rate / c.Peak * tall
		}
		c.Bars = append(c.Bars, bar{X: float64(i) * w, Y: tall - h, W: max(w-1, 1), H: h,
			Title: fmt.Sprintf("%d–%d min ago: %.1f/s (%d messages)", ago+1, ago, rate, byMinute[ago])})
	}
	return c
}

// table is a table's page: its counts, the chart of what it published,
// the live claims and the blocked keys.
func (c *console) table(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r, r.URL.Query().Get("table"))
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	v, err := c.describe(ctx, s)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	byMinute, err := s.PublishedByMinute(ctx, ChartMinutes)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	leases, err := s.Leases(ctx, ListMax)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	keys, err := s.BlockedKeys(ctx, ListMax)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	c.render(w, r, "table.html", map[string]any{"T": v, "Chart": newChart(byMinute), "Leases": leases, "Keys": keys,
		"Max": ListMax, "Now": time.Now()})
}

// ListMax is the most live claims and blocked keys a table's page lists,
// and the most messages of a key's queue.
const ListMax = 100

// describe reads a table's line of the overview.
func (c *console) describe(ctx context.Context, s *outbox.Store) (tableView, error) {
	v := tableView{Name: s.Table()}
	st, err := s.Stats(ctx)
	if err != nil {
		return v, err
	}
	v.Stats = st
	l, err := s.Layout(ctx)
	if err != nil {
		return v, err
	}
	v.Layout = l.String()
	o, err := s.TableOrdering(ctx)
	if err != nil {
		return v, err
	}
	v.Ordering = o.String()
	v.Version, v.Latest, err = s.SchemaVersion(ctx)
	return v, err
}

// key is a key's queue: its unpublished messages in the order ordered
// mode publishes them, with their states.
func (c *console) key(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r, r.URL.Query().Get("table"))
	if s == nil {
		return
	}
	key := r.URL.Query().Get("key")
	if key == "" {
		c.fail(w, r, http.StatusBadRequest, "no key given")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	q, err := s.KeyQueue(ctx, key, ListMax+1)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	more := len(q) > ListMax
	q = q[:min(len(q), ListMax)]
	l, err := s.Layout(ctx)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	c.render(w, r, "key.html", map[string]any{"Table": s.Table(), "Key": key, "Queue": q, "More": more, "Max": ListMax,
		"Log": l == outbox.LayoutLog})
}

// held lists the held messages: on an ordered table, those set aside
// behind a failed message of their key. They have no action of their own:
// they come back when the message before them is published, retried or
// discarded.
func (c *console) held(w http.ResponseWriter, r *http.Request) {
	f := readFilter(r.URL.Query())
	s := c.store(w, r, f.Table)
	if s == nil {
		return
	}
	f = f.of("held")
	f.Table = s.Table()
	q := outbox.HeldQuery{Limit: PageSize + 1, EventType: f.Type, Key: f.Key}
	if f.Older != "" {
		d, err := readAge(f.Older)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		q.CreatedBefore = time.Now().Add(-d)
	}
	if f.After != "" {
		seq, err := strconv.ParseInt(f.After, 10, 64)
		if err != nil || seq <= 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("the page's cursor %q is not one this console made", f.After))
			return
		}
		q.After = &outbox.Message{Seq: seq}
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	msgs, err := s.FindHeld(ctx, q)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	msgs, next := f.page(msgs, "held", func(m outbox.Message) string { return strconv.FormatInt(m.Seq, 10) })
	l, err := s.Layout(ctx)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	c.render(w, r, "held.html", map[string]any{"Filter": f, "Messages": msgs, "Next": next, "Log": l == outbox.LayoutLog})
}
