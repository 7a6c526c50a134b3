package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/acemq/outbox"
)

// cmdStatus is outbox status: the counts of a table's messages by state;
// of several tables, one line each.
func cmdStatus(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("status", x)
	asJSON := c.fs.Bool("json", false, "print the counts as one JSON document (keys in snake_case, ages in seconds); of several tables, an array of them")
	if err := c.parse(args); err != nil {
		return err
	}
	var docs []map[string]any
	var rows []tableStatus
	err := c.eachTable(ctx, nil, func(store *outbox.Store) error {
		st, err := store.Stats(ctx)
		if err != nil {
			return c.explain(err)
		}
		// Only an ordered table has keys to block: an unordered one shows
		// no blocked keys, whatever its parked messages' keys.
		ordering, err := store.TableOrdering(ctx)
		if err != nil {
			return c.explain(err)
		}
		ordered := ordering == outbox.OrderedByKey
		switch {
		case *asJSON && c.several():
			docs = append(docs, statusJSON(c.table, ordered, st))
			return nil
		case *asJSON:
			return writeJSON(c.stdout, statusJSON(c.table, ordered, st))
		case c.several():
			rows = append(rows, tableStatus{c.table, ordered, st})
			return nil
		}
		return c.printStatus(ordered, st)
	})
	switch {
	case !c.several():
	case *asJSON:
		if docs == nil {
			docs = []map[string]any{}
		}
		if werr := writeJSON(c.stdout, docs); err == nil {
			err = werr
		}
	case len(rows) > 0:
		if werr := c.printStatuses(rows); err == nil {
			err = werr
		}
	}
	return err
}

// tableStatus is a table's line of outbox status of several tables.
type tableStatus struct {
	table   string
	ordered bool
	st      outbox.Stats
}

// printStatuses prints the counts of several tables, a line each.
func (c *common) printStatuses(rows []tableStatus) error {
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "TABLE\tPENDING\tREADY\tIN FLIGHT\tRETRYING\tHELD\tPARKED\tSCHEDULED\tOLDEST PENDING\tBLOCKED KEYS\tPUBLISHED LAST HOUR\n")
	parked := 0
	for _, r := range rows {
		blocked := "-" // unordered: no key to block
		if r.ordered {
			blocked = fmt.Sprint(r.st.BlockedKeys)
		}
		if r.st.Parked > 0 {
			parked++
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\n", r.table, r.st.Pending, r.st.Ready, r.st.InFlight, r.st.Retrying, r.st.Held,
			r.st.Parked, r.st.Scheduled, r.st.OldestPendingAge.Round(time.Second), blocked, r.st.PublishedLastHour)
	}
	fmt.Fprintf(w, "\npending: every message not yet published, the six after it added up; outbox status --table TABLE explains each count\n")
	if parked > 0 {
		fmt.Fprintf(w, "%d table(s) have parked messages, which need a look: outbox parked --table TABLE\n", parked)
	}
	return w.Flush()
}

// printStatus prints the counts of c.table.
func (c *common) printStatus(ordered bool, st outbox.Stats) error {
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "table\t%s\n", c.table)
	fmt.Fprintf(w, "pending\t%d\n", st.Pending)
	fmt.Fprintf(w, "  ready\t%d\n", st.Ready)
	fmt.Fprintf(w, "  in flight\t%d\n", st.InFlight)
	fmt.Fprintf(w, "  retrying\t%d\n", st.Retrying)
	fmt.Fprintf(w, "  held\t%d\n", st.Held)
	fmt.Fprintf(w, "  parked\t%d\n", st.Parked)
	fmt.Fprintf(w, "  scheduled\t%d\n", st.Scheduled)
	if !st.NextDue.IsZero() {
		fmt.Fprintf(w, "next due\t%s (in %s)\n", st.NextDue.UTC().Format(time.RFC3339), time.Until(st.NextDue).Round(time.Second))
	}
	fmt.Fprintf(w, "oldest pending\t%s\n", st.OldestPendingAge.Round(time.Second))
	fmt.Fprintf(w, "oldest ready\t%s\n", st.OldestReadyAge.Round(time.Second))
	if ordered {
		fmt.Fprintf(w, "blocked keys\t%d\n", st.BlockedKeys)
	}
	fmt.Fprintf(w, "published last hour\t%d\n", st.PublishedLastHour)
	fmt.Fprintf(w, "\npending: every message not yet published, the six below it added up (as outbox_pending)\n")
	fmt.Fprintf(w, "ready: claimable now (outbox_ready); in flight: claimed by a relay; retrying: failed, waiting out its backoff\n")
	fmt.Fprintf(w, "parked: out of attempts, waiting for an operator; scheduled: delayed (Event.NotBefore), not due yet\n")
	if ordered {
		fmt.Fprintf(w, "held: in ordered mode, behind a failed message of their key; blocked keys: keys with a parked message\n")
	}
	if st.Parked > 0 {
		fmt.Fprintf(w, "\nparked messages need a look: outbox parked --table %s\n", c.table)
	}
	if ordered && st.BlockedKeys > 0 {
		fmt.Fprintf(w, "in ordered mode, a key with a parked message is blocked: its later messages wait until it is retried or discarded\n")
	}
	return w.Flush()
}

func cmdParked(ctx context.Context, x *cli, args []string) error {
	c := newOperatorCommon("parked", x)
	limit := c.fs.Int("limit", 50, "most messages to list, most recently parked first (of each table)")
	asJSON := c.fs.Bool("json", false, "print the messages as one JSON array, each with its whole last error and its headers (and its table, of several tables)")
	full := c.fs.Bool("full", false, "print each message as a block, with its whole last error (lines kept) and its headers, instead of a table that cuts the error short")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := c.positive(map[string]int64{"limit": int64(*limit)}); err != nil {
		return err
	}
	if *asJSON && *full {
		return c.usageError("--json and --full are two outputs: give one")
	}
	all := []parkedMessage{} // of several tables, with --json
	tables, parked := 0, 0
	err := c.eachTable(ctx, nil, func(store *outbox.Store) error {
		msgs, err := store.Parked(ctx, *limit)
		if err != nil {
			return c.explain(err)
		}
		tables++
		switch {
		case *asJSON && c.several():
			for _, m := range parkedJSON(msgs) {
				m.Table = c.table
				all = append(all, m)
			}
			return nil
		case *asJSON:
			return writeJSON(c.stdout, parkedJSON(msgs))
		case c.several() && len(msgs) == 0:
			return nil
		case c.several():
			if parked > 0 {
				fmt.Fprintln(c.stdout)
			}
			fmt.Fprintf(c.stdout, "== table %s: %d parked message(s)\n", c.table, len(msgs))
			parked++
		}
		return c.printParked(ctx, store, msgs, *full)
	})
	switch {
	case !c.several():
	case *asJSON:
		if werr := writeJSON(c.stdout, all); err == nil {
			err = werr
		}
	case parked == 0 && tables > 0:
		fmt.Fprintf(c.stdout, "no parked messages in the %d table(s)\n", tables)
	}
	return err
}

// printParked prints the parked messages msgs of c.table (store's).
func (c *common) printParked(ctx context.Context, store *outbox.Store, msgs []outbox.Message, full bool) error {
	if len(msgs) == 0 {
		fmt.Fprintln(c.stdout, "no parked messages")
		return nil
	}
	ordering, err := store.TableOrdering(ctx)
	if err != nil {
		return c.explain(err)
	}
	ordered := ordering == outbox.OrderedByKey
	keyTitle := "KEY"
	if ordered {
		keyTitle = "BLOCKED KEY" // in ordered mode the key waits for this message
	}
	if full {
		printParkedFull(c.stdout, msgs, strings.ToLower(keyTitle))
	} else {
		w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(w, "ID\tEVENT TYPE\t%s\tATTEMPTS\tPARKED AT\tLAST ERROR\n", keyTitle)
		cut := false
		for _, m := range msgs {
			key := "-" // no key: blocks nothing
			if m.Key != "" {
				key = printable(m.Key, 40)
			}
			lastError := printable(m.LastError, lastErrorWidth)
			cut = cut || lastError != printable(m.LastError, -1)
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, printable(m.EventType, 60), key, m.Attempts, m.ParkedAt.UTC().Format(time.RFC3339), lastError)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if cut {
			fmt.Fprintf(c.stdout, "\nsome errors are cut short (…): --full prints them whole, --json as JSON\n")
		}
	}
	fmt.Fprintln(c.stdout)
	if ordered {
		fmt.Fprintf(c.stdout, "in ordered mode each key shown is blocked: its later messages wait until its parked message is retried or discarded\n")
	}
	fmt.Fprintf(c.stdout, "re-arm with: outbox retry --table %s ID... (or --all-parked)\n", c.table)
	fmt.Fprintf(c.stdout, "give up with: outbox discard --table %s ID...\n", c.table)
	return nil
}

// lastErrorWidth is how much of a last error the table of outbox parked
// shows; --full and --json show it whole.
const lastErrorWidth = 120

// printParkedFull prints each parked message as a block of fields, its
// last error whole, one line of the error per line of output.
func printParkedFull(out io.Writer, msgs []outbox.Message, keyTitle string) {
	for i, m := range msgs {
		if i > 0 {
			fmt.Fprintln(out)
		}
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		key := "-"
		if m.Key != "" {
			key = printable(m.Key, -1)
		}
		fmt.Fprintf(w, "id\t%s\n", m.ID)
		fmt.Fprintf(w, "event type\t%s\n", printable(m.EventType, -1))
		fmt.Fprintf(w, "%s\t%s\n", keyTitle, key)
		fmt.Fprintf(w, "exchange\t%s\n", printable(m.Exchange, -1))
		fmt.Fprintf(w, "routing key\t%s\n", printable(m.RoutingKey, -1))
		fmt.Fprintf(w, "attempts\t%d\n", m.Attempts)
		fmt.Fprintf(w, "created at\t%s\n", m.CreatedAt.UTC().Format(time.RFC3339Nano))
		fmt.Fprintf(w, "parked at\t%s\n", m.ParkedAt.UTC().Format(time.RFC3339Nano))
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			fmt.Fprintf(w, "header\t%s: %s\n", printable(k, -1), printable(m.Headers[k], -1))
		}
		lines := strings.Split(strings.TrimRight(strings.ReplaceAll(m.LastError, "\r\n", "\n"), "\n"), "\n")
		for j, line := range lines {
			title := ""
			if j == 0 {
				title = "last error"
			}
			fmt.Fprintf(w, "%s\t%s\n", title, printable(line, -1))
		}
		_ = w.Flush()
	}
}

// parkedMessage is a parked message as outbox parked --json prints it.
type parkedMessage struct {
	Table      string            `json:"table,omitempty"` // of several tables
	ID         string            `json:"id"`
	Type       string            `json:"type"`
	Key        string            `json:"key"`
	Exchange   string            `json:"exchange"`
	RoutingKey string            `json:"routing_key"`
	Attempts   int               `json:"attempts"`
	CreatedAt  time.Time         `json:"created_at"`
	ParkedAt   time.Time         `json:"parked_at"`
	LastError  string            `json:"last_error"`
	Headers    map[string]string `json:"headers"`
}

func parkedJSON(msgs []outbox.Message) []parkedMessage {
	out := make([]parkedMessage, 0, len(msgs)) // none: [], not null
	for _, m := range msgs {
		h := m.Headers
		if h == nil {
			h = map[string]string{}
		}
		out = append(out, parkedMessage{ID: m.ID, Type: m.EventType, Key: m.Key, Exchange: m.Exchange, RoutingKey: m.RoutingKey,
			Attempts: m.Attempts, CreatedAt: m.CreatedAt.UTC(), ParkedAt: m.ParkedAt.UTC(), LastError: m.LastError, Headers: h})
	}
	return out
}

// statusJSON is outbox status --json's document: the table, whether it is
// ordered, and every count of outbox.Stats under its name in snake_case (a
// duration in seconds, name_seconds), so that a count Stats gains is in
// the document too. An unordered table has no blocked keys: the count is
// left out.
func statusJSON(table string, ordered bool, st outbox.Stats) map[string]any {
	doc := map[string]any{"table": table, "ordered": ordered}
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() || f.Name == "BlockedKeys" && !ordered {
			continue
		}
		name := snakeCase(f.Name)
		switch x := v.Field(i).Interface().(type) {
		case time.Duration:
			doc[name+"_seconds"] = x.Seconds()
		case time.Time: // NextDue: null when nothing waits
			doc[name] = nil
			if !x.IsZero() {
				doc[name] = x.UTC().Format(time.RFC3339Nano)
			}
		default:
			doc[name] = x
		}
	}
	return doc
}

// snakeCase turns a Go field name into a JSON key: OldestPendingAge is
// oldest_pending_age.
func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeJSON prints v as one indented JSON document.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printable makes text from the table safe for a terminal and a table
// layout: whitespace runs become one space, other control characters
// (escape sequences, say) are shown escaped, and the text is cut to n
// characters, never inside one (n < 0: not cut).
func printable(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	var b strings.Builder
	count := 0
	for _, r := range s {
		if count == n {
			b.WriteString("…")
			break
		}
		if unicode.IsControl(r) || !unicode.IsPrint(r) && r != ' ' {
			fmt.Fprintf(&b, "\\x{%x}", r)
		} else {
			b.WriteRune(r)
		}
		count++
	}
	return b.String()
}
