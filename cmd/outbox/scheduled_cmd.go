package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/acemq/outbox"
)

// scheduledDryRunLimit bounds the delayed messages a dry run reads.
const scheduledDryRunLimit = 100_000

// cmdScheduled lists the delayed messages of a table (Event.NotBefore),
// the soonest due first, or publishes some now, or discards them.
func cmdScheduled(ctx context.Context, x *cli, args []string) error {
	c := newCommon("scheduled", x, outbox.TableDefault)
	c.positional = "[ID...]"
	limit := c.fs.Int("limit", 50, "most messages to list, the soonest due first")
	asJSON := c.fs.Bool("json", false, "print the messages as one JSON array")
	now := c.fs.Bool("publish-now", false, "make the delayed messages of the ids given due now: a relay publishes them within its usual latency")
	discard := c.fs.Bool("discard", false, "delete the delayed messages of the ids given: they are never published")
	dryRun := c.fs.Bool("dry-run", false, "with --publish-now or --discard: say which of the ids are delayed messages, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := c.positive(map[string]int64{"limit": int64(*limit)}); err != nil {
		return err
	}
	ids := c.args
	switch {
	case *now && *discard:
		return c.usageError("--publish-now and --discard are two actions: give one")
	case (*now || *discard) && len(ids) == 0:
		return c.usageError("give the ids of the delayed messages (outbox scheduled lists them)")
	case !*now && !*discard && (len(ids) > 0 || *dryRun):
		return c.usageError("ids and --dry-run go with --publish-now or --discard")
	}
	if err := c.messageIDs(ids); err != nil {
		return err
	}
	db, store, err := c.open(ctx, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if !*now && !*discard {
		msgs, err := store.Scheduled(ctx, *limit)
		if err != nil {
			return c.explain(err)
		}
		if *asJSON {
			return writeJSON(c.stdout, scheduledJSON(msgs))
		}
		printScheduled(c, msgs)
		return nil
	}
	verb, done := "publish now", "made due now: a relay moves them into the table within a second and publishes them"
	act := store.PublishNow
	if *discard {
		verb, done, act = "discard", "deleted: they will not be published", store.DiscardScheduled
	}
	if *dryRun {
		msgs, err := store.Scheduled(ctx, scheduledDryRunLimit)
		if err != nil {
			return c.explain(err)
		}
		found := idsAmong(msgs, ids)
		fmt.Fprintf(c.stdout, "would %s %d of the %d id(s) given, the delayed messages of table %s: %s\ndry run: nothing changed\n",
			verb, len(found), len(ids), c.table, strings.Join(found, " "))
		return nil
	}
	fmt.Fprintf(c.stderr, "%s: %d message(s) of table %s, those of them that are delayed\n", verb, len(ids), c.table)
	n, err := act(ctx, ids...)
	if err != nil {
		return c.explain(err)
	}
	fmt.Fprintf(c.stdout, "%d delayed message(s) of table %s %s\n", n, c.table, done)
	if int(n) < len(ids) {
		fmt.Fprintf(c.stdout, "%d id(s) were not delayed messages of %s and were left alone\n", len(ids)-int(n), c.table)
	}
	return nil
}

func printScheduled(c *common, msgs []outbox.Message) {
	if len(msgs) == 0 {
		fmt.Fprintln(c.stdout, "no delayed messages")
		return
	}
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "ID\tEVENT TYPE\tKEY\tDUE\tIN\tWRITTEN AT\tNOTE\n")
	for _, m := range msgs {
		key := "-"
		if m.Key != "" {
			key = printable(m.Key, 40)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, printable(m.EventType, 60), key, m.NotBefore.UTC().Format(time.RFC3339),
			time.Until(m.NotBefore).Round(time.Second), m.CreatedAt.UTC().Format(time.RFC3339), printable(m.LastError, lastErrorWidth))
	}
	_ = w.Flush()
	fmt.Fprintf(c.stdout, "\npublish one now with: outbox scheduled --table %s --publish-now ID...\n", c.table)
	fmt.Fprintf(c.stdout, "give one up with: outbox scheduled --table %s --discard ID...\n", c.table)
}

// scheduledMessage is a delayed message as outbox scheduled --json prints
// it.
type scheduledMessage struct {
	ID         string            `json:"id"`
	Type       string            `json:"type"`
	Key        string            `json:"key"`
	Exchange   string            `json:"exchange"`
	RoutingKey string            `json:"routing_key"`
	NotBefore  time.Time         `json:"not_before"`
	CreatedAt  time.Time         `json:"created_at"`
	LastError  string            `json:"last_error,omitempty"`
	Headers    map[string]string `json:"headers"`
}

func scheduledJSON(msgs []outbox.Message) []scheduledMessage {
	out := make([]scheduledMessage, 0, len(msgs)) // none: [], not null
	for _, m := range msgs {
		h := m.Headers
		if h == nil {
			h = map[string]string{}
		}
		out = append(out, scheduledMessage{ID: m.ID, Type: m.EventType, Key: m.Key, Exchange: m.Exchange, RoutingKey: m.RoutingKey,
			NotBefore: m.NotBefore.UTC(), CreatedAt: m.CreatedAt.UTC(), LastError: m.LastError, Headers: h})
	}
	return out
}
