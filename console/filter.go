package console

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/acemq/outbox"
)

// filter is what a list of messages shows, read from a request's query
// (or form): the parked, held and delayed lists each keep the fields they
// take (of).
type filter struct {
	Table, Type, Key, Error string
	Older                   string // parked (held: written) at least this long ago (a Go duration, or days: "2d")
	DueIn                   string // delayed lists: due at least this long from now
	After                   string // the cursor of the last message of the previous page (see cutCursor)
}

// of is the filter with only the fields list takes: parked messages are
// chosen by type, key, error text and age, held ones by type, key and
// age, delayed ones by type, key and due time.
func (f filter) of(list string) filter {
	switch list {
	case "held":
		f.Error, f.DueIn = "", ""
	case "delayed":
		f.Error, f.Older = "", ""
	default: // parked
		f.DueIn = ""
	}
	return f
}

// cutCursor reads a list's cursor, "<µs since the epoch>.<rest>", as the
// console writes it: a time and what tells apart the messages of that
// time (a seq, an id).
func cutCursor(c string) (time.Time, string, error) {
	at, rest, ok := strings.Cut(c, ".")
	us, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || us <= 0 || rest == "" {
		return time.Time{}, "", fmt.Errorf("the page's cursor %q is not one this console made", c)
	}
	return time.UnixMicro(us), rest, nil
}

func readFilter(v url.Values) filter {
	return filter{Table: v.Get("table"), Type: v.Get("type"), Key: v.Get("key"), Error: v.Get("error"), Older: v.Get("older"),
		DueIn: v.Get("due_in"), After: v.Get("after")}
}

// age reads an age the console is given: a Go duration ("90m", "1h30m")
// or a number of days ("2d").
func readAge(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseFloat(days, 64); err == nil && n >= 0 && n < 100_000 {
			return time.Duration(n * float64(24*time.Hour)), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("the age %q is not one: write a duration such as 90m, 2h or 3d", s)
	}
	return d, nil
}

// query is the filter's outbox.ParkedQuery.
func (f filter) query(limit int) (outbox.ParkedQuery, error) {
	q := outbox.ParkedQuery{Limit: limit, EventType: f.Type, Key: f.Key, ErrorText: f.Error}
	if f.After != "" {
		at, rest, err := cutCursor(f.After)
		if err != nil {
			return q, err
		}
		seq, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return q, fmt.Errorf("the page's cursor %q is not one this console made", f.After)
		}
		q.After = &outbox.Message{ParkedAt: at, Seq: seq}
	} else if f.Older != "" {
		// The list runs from the latest parked back: those parked at
		// least Older ago are the list from that time on.
		d, err := readAge(f.Older)
		if err != nil {
			return q, err
		}
		q.After = &outbox.Message{ParkedAt: time.Now().Add(-d), Seq: math.MaxInt64}
	}
	return q, nil
}

// values are the filter's fields as a query, without the cursor.
func (f filter) values() url.Values {
	v := url.Values{"table": {f.Table}}
	for k, s := range map[string]string{"type": f.Type, "key": f.Key, "error": f.Error, "older": f.Older, "due_in": f.DueIn} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// page cuts msgs, read PageSize+1 at a time, to a page, and returns the
// link to the next page of list (the filter's, after the cursor of the
// page's last message), "" when there is none.
func (f filter) page(msgs []outbox.Message, list string, cursor func(outbox.Message) string) ([]outbox.Message, string) {
	if len(msgs) <= PageSize {
		return msgs, ""
	}
	msgs = msgs[:PageSize]
	v := f.values()
	v.Set("after", cursor(msgs[len(msgs)-1]))
	return msgs, list + "?" + v.Encode()
}

// scheduledQuery is the filter's outbox.ScheduledQuery: its type and key,
// and its cursor "<due µs>.<id>".
func (f filter) scheduledQuery(limit int) (outbox.ScheduledQuery, error) {
	q := outbox.ScheduledQuery{Limit: limit, EventType: f.Type, Key: f.Key}
	if f.After != "" {
		at, id, err := cutCursor(f.After)
		if err != nil {
			return q, err
		}
		q.After = &outbox.Message{NotBefore: at, ID: id}
	} else if f.DueIn != "" {
		// The list runs from the soonest due on: those due at least DueIn
		// from now are the list from that time on.
		d, err := readAge(f.DueIn)
		if err != nil {
			return q, err
		}
		q.After = &outbox.Message{NotBefore: time.Now().Add(d), ID: "ffffffff-ffff-ffff-ffff-ffffffffffff"}
	}
	return q, nil
}
