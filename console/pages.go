package console

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
)

// tableView is one table's line of the overview.
type tableView struct {
	Name            string
	Layout          string
	Ordering        string
	Version, Latest int // the newest of its layout's migrations it has, and the latest
	Stats           outbox.Stats
	Err             string
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	var views []tableView
	for _, name := range c.names {
		v, err := c.describe(ctx, c.stores[name])
		if err != nil {
			v.Err = err.Error()
		}
		views = append(views, v)
	}
	type inboxView struct {
		Name, Consumer, Table string
		Records               inbox.Records
		Err                   string
	}
	var inboxes []inboxView
	for _, name := range c.inboxNames {
		ib := c.inboxes[name]
		v := inboxView{Name: name, Consumer: ib.ConsumerName(), Table: ib.Table()}
		recs, err := ib.Records(ctx)
		if err != nil {
			v.Err = err.Error()
		}
		v.Records = recs
		inboxes = append(inboxes, v)
	}
	c.render(w, r, "overview.html", map[string]any{"Tables": views, "Inboxes": inboxes})
}

// inboxDead lists an inbox's dead letters, the oldest first.
func (c *console) inboxDead(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("inbox")
	ib := c.inboxes[name]
	if ib == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no inbox %q in this console", name))
		return
	}
	q := inbox.DeadQuery{Limit: PageSize + 1}
	if after := r.URL.Query().Get("after"); after != "" {
		at, id, err := cutCursor(after)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		q.After = &inbox.DeadRecord{DeadAt: at, MessageID: id}
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	dead, err := ib.FindDead(ctx, q)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	var next string
	if len(dead) > PageSize {
		dead = dead[:PageSize]
		last := dead[len(dead)-1]
		next = "inbox?" + url.Values{"inbox": {name}, "after": {fmt.Sprintf("%d.%s", last.DeadAt.UnixMicro(), last.MessageID)}}.Encode()
	}
	c.render(w, r, "inbox.html", map[string]any{"Inbox": name, "Dead": dead, "Next": next, "Done": r.URL.Query().Get("done"),
		"Queue": c.lookDeadQueue(ctx, name)})
}

func (c *console) store(w http.ResponseWriter, r *http.Request, name string) *outbox.Store {
	if name == "" && len(c.names) == 1 {
		name = c.names[0]
	}
	s := c.stores[name]
	if s == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no table %q in this console", name))
	}
	return s
}

func (c *console) parked(w http.ResponseWriter, r *http.Request) {
	f := readFilter(r.URL.Query()).of("parked")
	s := c.store(w, r, f.Table)
	if s == nil {
		return
	}
	f.Table = s.Table()
	q, err := f.query(PageSize + 1)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	msgs, err := s.FindParked(ctx, q)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	msgs, next := f.page(msgs, "parked", func(m outbox.Message) string { return fmt.Sprintf("%d.%d", m.ParkedAt.UnixMicro(), m.Seq) })
	c.render(w, r, "parked.html", map[string]any{
		"Filter": f, "Messages": msgs, "Next": next, "Done": r.URL.Query().Get("done"),
		"FilterQuery": f.values().Encode(),
	})
}

func (c *console) delayed(w http.ResponseWriter, r *http.Request) {
	f := readFilter(r.URL.Query())
	s := c.store(w, r, f.Table)
	if s == nil {
		return
	}
	f = f.of("delayed")
	f.Table = s.Table()
	q, err := f.scheduledQuery(PageSize + 1)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	msgs, err := s.FindScheduled(ctx, q)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	msgs, next := f.page(msgs, "delayed", func(m outbox.Message) string { return fmt.Sprintf("%d.%s", m.NotBefore.UnixMicro(), m.ID) })
	c.render(w, r, "delayed.html", map[string]any{"Filter": f, "Messages": msgs, "Next": next, "Done": r.URL.Query().Get("done")})
}

// action is what a confirmation asks and an act does.
type action struct {
	Name   string // retry, discard, publish-now
	Filter filter
	IDs    []string // the messages chosen; none: every parked one the filter matches (retry, discard)
	Inbox  string   // the inbox of an inbox-retry
}

func readAction(v url.Values) (action, error) {
	a := action{Name: v.Get("action"), Filter: readFilter(v), IDs: v["id"], Inbox: v.Get("inbox")}
	a.Filter.After = ""
	switch a.Name {
	case "retry", "discard", "publish-now", "inbox-retry", "inbox-replay":
	default:
		return a, fmt.Errorf("no action %q: retry, discard, publish-now, inbox-retry or inbox-replay", a.Name)
	}
	if a.Name == "inbox-replay" {
		return a, nil // the whole dead-letter queue, up to BulkMax
	}
	if v.Get("scope") != "filter" && len(a.IDs) == 0 {
		return a, fmt.Errorf("no message chosen: tick some, or act on every message the filter shows")
	}
	if v.Get("scope") == "filter" {
		a.IDs = nil
	}
	if a.Name == "publish-now" {
		a.Filter = a.Filter.of("delayed")
	} else {
		a.Filter = a.Filter.of("parked")
	}
	if len(a.IDs) > BulkMax {
		return a, fmt.Errorf("%d messages chosen: at most %d at once", len(a.IDs), BulkMax)
	}
	return a, nil
}

// targets are the messages an action by filter would change, at most
// BulkMax: the parked messages the filter matches (retry, discard), or
// the delayed ones (publish-now).
func (c *console) targets(ctx context.Context, s *outbox.Store, a action) ([]outbox.Message, error) {
	if a.Name == "publish-now" {
		q, err := a.Filter.scheduledQuery(outbox.ScheduledQueryMax)
		if err != nil {
			return nil, err
		}
		return paged(outbox.ScheduledQueryMax, q.After, func(limit int, after *outbox.Message) ([]outbox.Message, error) {
			q.Limit, q.After = limit, after
			return s.FindScheduled(ctx, q)
		})
	}
	q, err := a.Filter.query(outbox.ParkedQueryMax)
	if err != nil {
		return nil, err
	}
	return paged(outbox.ParkedQueryMax, q.After, func(limit int, after *outbox.Message) ([]outbox.Message, error) {
		q.Limit, q.After = limit, after
		return s.FindParked(ctx, q)
	})
}

// paged reads up to BulkMax messages by pages of at most size from find,
// from after (nil: the first), each page after the last message of the
// one before.
func paged(size int, after *outbox.Message, find func(limit int, after *outbox.Message) ([]outbox.Message, error)) ([]outbox.Message, error) {
	var all []outbox.Message
	for len(all) < BulkMax {
		limit := min(size, BulkMax-len(all))
		page, err := find(limit, after)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < limit {
			break
		}
		after = &all[len(all)-1]
	}
	return all, nil
}

func (c *console) confirm(w http.ResponseWriter, r *http.Request) {
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "this console is read-only")
		return
	}
	a, err := readAction(r.URL.Query())
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if a.Name == "inbox-replay" {
		c.confirmReplay(w, r, a)
		return
	}
	if a.Name == "inbox-retry" {
		if c.inboxes[a.Inbox] == nil {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no inbox %q in this console", a.Inbox))
			return
		}
		data := map[string]any{"Action": a, "Count": len(a.IDs), "Sample": a.IDs[:min(len(a.IDs), 20)],
			"Back": "inbox?inbox=" + url.QueryEscape(a.Inbox), "Of": a.Inbox, "ByFilter": a.IDs == nil}
		if a.IDs == nil { // every dead letter of the inbox
			ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
			defer cancel()
			ib := c.inboxes[a.Inbox]
			recs, err := ib.Records(ctx)
			if err != nil {
				c.fail(w, r, http.StatusInternalServerError, err.Error())
				return
			}
			first, err := ib.FindDead(ctx, inbox.DeadQuery{Limit: 20})
			if err != nil {
				c.fail(w, r, http.StatusInternalServerError, err.Error())
				return
			}
			var sample []string
			for _, d := range first {
				sample = append(sample, d.MessageID)
			}
			data["Count"], data["Sample"] = int(recs.Dead), sample
		}
		c.render(w, r, "confirm.html", data)
		return
	}
	s := c.store(w, r, a.Filter.Table)
	if s == nil {
		return
	}
	a.Filter.Table = s.Table()
	back := "parked?" + a.Filter.values().Encode()
	if a.Name == "publish-now" {
		back = "delayed?" + a.Filter.values().Encode()
	}
	data := map[string]any{"Action": a, "Count": len(a.IDs), "Sample": a.IDs[:min(len(a.IDs), 20)], "ByFilter": a.IDs == nil, "Back": back, "Of": s.Table()}
	if a.IDs == nil {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
		defer cancel()
		msgs, err := c.targets(ctx, s, a)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, err.Error())
			return
		}
		var sample []string
		for _, m := range msgs[:min(len(msgs), 20)] {
			sample = append(sample, m.ID)
		}
		data["Count"], data["Sample"], data["Capped"] = len(msgs), sample, len(msgs) == BulkMax
	}
	c.render(w, r, "confirm.html", data)
}

func (c *console) act(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusRequestEntityTooLarge, "the request is too large or malformed")
		return
	}
	if !c.csrfValid(r) {
		c.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
		return
	}
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "this console is read-only")
		return
	}
	a, err := readAction(r.PostForm)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	switch a.Name {
	case "inbox-retry":
		c.inboxRetry(w, r, a)
		return
	case "inbox-replay":
		c.replay(w, r, a)
		return
	}
	s := c.store(w, r, a.Filter.Table)
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	ids := a.IDs
	if ids == nil {
		msgs, err := c.targets(ctx, s, a)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, err.Error())
			return
		}
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
	}
	var n int64
	switch {
	case len(ids) == 0:
	case a.Name == "retry":
		n, err = s.Retry(ctx, ids...)
	case a.Name == "discard":
		n, err = s.Discard(ctx, ids...)
	default:
		n, err = s.PublishNow(ctx, ids...)
	}
	c.log.Info("console: "+a.Name, "table", s.Table(), "by", who(r), "asked", len(ids), "changed", n,
		"by_filter", a.IDs == nil, "type", a.Filter.Type, "key", a.Filter.Key, "error_text", a.Filter.Error, "err", err)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	page, v := "parked", a.Filter.values()
	if a.Name == "publish-now" {
		page = "delayed"
	}
	v.Set("done", fmt.Sprintf("%s: %d of %d messages", a.Name, n, len(ids)))
	http.Redirect(w, r, page+"?"+v.Encode(), http.StatusSeeOther)
}

func (c *console) render(w http.ResponseWriter, r *http.Request, page string, data map[string]any) {
	data["CSRF"], data["ReadOnly"], data["Tables"+"List"] = c.csrfToken(r), c.cfg.ReadOnly, c.names
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, page, data); err != nil {
		c.log.Error("console: rendering a page", "page", page, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = buf.WriteTo(w)
}

func (c *console) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	var buf bytes.Buffer
	_ = pages.ExecuteTemplate(&buf, "error.html", map[string]any{"Code": code, "Message": msg, "TablesList": c.names})
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

// age says how long d is, to a second past a minute.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// preview is at most PayloadPreviewMax bytes of b as text, cut at a
// character, said so when cut.
func preview(b []byte) string {
	if len(b) <= PayloadPreviewMax {
		return strings.ToValidUTF8(string(b), "\uFFFD")
	}
	cut := b[:PayloadPreviewMax]
	for i := 0; i < utf8.UTFMax-1 && len(cut) > 0 && !utf8.RuneStart(b[len(cut)]); i++ {
		cut = cut[:len(cut)-1] // not in the middle of a character
	}
	return strings.ToValidUTF8(string(cut), "\uFFFD") + fmt.Sprintf(" … (%d bytes in all)", len(b))
}

// inboxRetry makes an inbox's dead letters eligible again.
func (c *console) inboxRetry(w http.ResponseWriter, r *http.Request, a action) {
	ib := c.inboxes[a.Inbox]
	if ib == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no inbox %q in this console", a.Inbox))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	var (
		n   int64
		err error
	)
	if a.IDs == nil {
		n, err = ib.RetryAllDead(ctx)
	} else {
		n, err = ib.Retry(ctx, a.IDs...)
	}
	c.log.Info("console: inbox-retry", "table", ib.Table(), "consumer", ib.ConsumerName(), "by", who(r), "asked", len(a.IDs), "changed", n,
		"every_dead", a.IDs == nil, "err", err)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	done := fmt.Sprintf("inbox-retry: %d of %d messages", n, len(a.IDs))
	if a.IDs == nil {
		done = fmt.Sprintf("inbox-retry: %d messages", n)
	}
	v := url.Values{"inbox": {a.Inbox}, "done": {done}}
	http.Redirect(w, r, "inbox?"+v.Encode(), http.StatusSeeOther)
}
