package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/dberr"
)

const inboxUsage = `Usage:
  outbox inbox schema [--table inbox] [--apply]                     print (or create) the inbox table's DDL
  outbox inbox purge  --consumer NAME --older-than 720h [--dry-run]  delete old records of handled messages
  outbox inbox dead   --consumer NAME [--limit 50]                   list the messages a consumer dead-lettered
  outbox inbox retry  --consumer NAME (ID... | --all) [--dry-run]    make dead-lettered messages eligible again
  outbox inbox replay --from QUEUE [--to QUEUE] [--limit N] [--dry-run]
                                                                    move messages from a dead-letter queue back

To replay what a consumer dead-lettered once its cause is fixed: run
"outbox inbox retry --consumer NAME --all" (or name the ids), then
"outbox inbox replay --from QUEUE.dead", QUEUE being the consumer's queue
(QUEUE.dead is the dead-letter queue that outbox declare --queue QUEUE and
package topology declare for it). The order matters: a replayed message
whose record still says dead is dead-lettered again.
`

// replayHint says how to move dead letters back, naming the dead-letter
// queue by the rule of outbox declare and package topology (Queue's
// DeadLetterQueue: Name + ".dead"): the inbox knows its consumer, not the
// queue it consumes.
const replayHint = "outbox inbox replay --from QUEUE.dead (the dead-letter queue of the queue the consumer consumes, as outbox declare --queue QUEUE names it)"

// cmdInbox runs the operator commands of package inbox's table.
func cmdInbox(ctx context.Context, x *cli, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(x.stdout, inboxUsage)
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	switch args[0] {
	case "schema":
		return cmdInboxSchema(ctx, x, args[1:])
	case "purge":
		return cmdInboxPurge(ctx, x, args[1:])
	case "dead":
		return cmdInboxDead(ctx, x, args[1:])
	case "retry":
		return cmdInboxRetry(ctx, x, args[1:])
	case "replay":
		return cmdInboxReplay(ctx, x, args[1:])
	}
	fmt.Fprintf(x.stderr, "outbox inbox: unknown command %q\n\n%s", args[0], inboxUsage)
	return errUsage
}

func cmdInboxSchema(ctx context.Context, x *cli, args []string) error {
	c := newCommon("inbox schema", x, inbox.TableDefault)
	apply := c.fs.Bool("apply", false, "create the table in the database instead of printing the DDL")
	if err := c.parse(args); err != nil {
		return err
	}
	schema := inbox.Schema
	if c.onMySQL() {
		schema = inbox.MySQLSchema
	}
	ddl, err := schema(c.table)
	if err != nil {
		return err
	}
	if c.onMySQL() { // one statement, without its ';' (go-sql-driver runs one at a time)
		ddl = strings.TrimSuffix(strings.TrimSpace(ddl), ";")
		if !*apply {
			ddl += ";\n"
		}
	}
	return c.printOrApply(ctx, ddl, *apply)
}

// inboxCommand is an inbox command's flags and its inbox.
type inboxCommand struct {
	*common
	consumer *string
}

func newInboxCommand(name string, x *cli) *inboxCommand {
	c := &inboxCommand{common: newCommon("inbox "+name, x, inbox.TableDefault)}
	c.consumer = c.fs.String("consumer", "", "the consumer (inbox.Config.Consumer) whose records to use; required")
	return c
}

// open connects and returns the consumer's inbox, having checked that the
// consumer has records at all (a misspelt name would otherwise act on
// nothing, silently).
func (c *inboxCommand) open(ctx context.Context) (*inbox.Inbox, inbox.Records, func(), error) {
	if *c.consumer == "" {
		return nil, inbox.Records{}, nil, c.usageError("--consumer is required, e.g. --consumer billing")
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return nil, inbox.Records{}, nil, err
	}
	ib, err := inbox.New(db, &inbox.Config{Consumer: *c.consumer, Table: c.table})
	if err != nil {
		db.Close()
		return nil, inbox.Records{}, nil, err
	}
	recs, err := ib.Records(ctx)
	if err != nil {
		db.Close()
		return nil, recs, nil, c.explainInbox(err)
	}
	if recs == (inbox.Records{}) {
		db.Close()
		return nil, recs, nil, fmt.Errorf("consumer %q has no records in table %s: check --consumer (it is inbox.Config.Consumer) and --table", *c.consumer, c.table)
	}
	return ib, recs, func() { db.Close() }, nil
}

// explainInbox turns a missing inbox table into advice.
func (c *common) explainInbox(err error) error {
	if dberr.Classify(err) == dberr.NoTable {
		return fmt.Errorf("inbox table %q does not exist in this database: create it with `outbox inbox schema --apply --table %s` or your migrations (inbox/migrations in the module)", c.table, c.table)
	}
	return err
}

func cmdInboxPurge(ctx context.Context, x *cli, args []string) error {
	c := newInboxCommand("purge", x)
	olderThan := c.fs.Duration("older-than", 0, "delete records of messages handled or dead-lettered longer ago than this (e.g. 720h); required. Keep them longer than a message may be redelivered")
	dryRun := c.fs.Bool("dry-run", false, "say how many records would be deleted, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if *c.consumer == "" || *olderThan <= 0 {
		return c.usageError("--consumer and a positive --older-than are required, e.g. --consumer billing --older-than 720h")
	}
	ib, _, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	due, err := ib.Purgeable(ctx, *olderThan)
	if err != nil {
		return c.explainInbox(err)
	}
	if *dryRun {
		fmt.Fprintf(c.stdout, "would purge %d record(s) of consumer %s older than %s from table %s\ndry run: nothing deleted\n", due, *c.consumer, *olderThan, c.table)
		return nil
	}
	n, err := ib.Purge(ctx, *olderThan)
	if err != nil {
		return fmt.Errorf("after purging %d: %w", n, c.explainInbox(err))
	}
	fmt.Fprintf(c.stdout, "purged %d record(s) of consumer %s older than %s from table %s\n", n, *c.consumer, *olderThan, c.table)
	return nil
}

func cmdInboxDead(ctx context.Context, x *cli, args []string) error {
	c := newInboxCommand("dead", x)
	limit := c.fs.Int("limit", 50, "most records to list, the oldest first")
	if err := c.parse(args); err != nil {
		return err
	}
	if err := c.positive(map[string]int64{"limit": int64(*limit)}); err != nil {
		return err
	}
	ib, recs, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	dead, err := ib.Dead(ctx, *limit)
	if err != nil {
		return c.explainInbox(err)
	}
	if len(dead) == 0 {
		fmt.Fprintf(c.stdout, "consumer %s has dead-lettered nothing (%d handled, %d failing) in table %s\n", *c.consumer, recs.Handled, recs.Failing, c.table)
		return nil
	}
	// Ids are printed whole, as shell words (quoted when they hold
	// spaces, quotes or control characters): pasted into `outbox inbox
	// retry`, each gives back the exact id. The last error is only read.
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MESSAGE ID\tATTEMPTS\tDEAD SINCE\tLAST ERROR")
	for _, d := range dead {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", shellWord(d.MessageID), d.Attempts, d.DeadAt.UTC().Format(time.RFC3339), printable(d.LastError, 120))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if recs.Dead > int64(len(dead)) {
		fmt.Fprintf(c.stdout, "(%d of %d shown: --limit)\n", len(dead), recs.Dead)
	}
	fmt.Fprintf(c.stdout, "\nafter fixing the cause: outbox inbox retry --consumer %s --table %s --all (or -- ID... for some, pasted as shown), then %s\n", *c.consumer, c.table, replayHint)
	return nil
}

func cmdInboxRetry(ctx context.Context, x *cli, args []string) error {
	c := newInboxCommand("retry", x)
	c.positional = "ID..."
	all := c.fs.Bool("all", false, "every message the consumer dead-lettered")
	dryRun := c.fs.Bool("dry-run", false, "say what would be made eligible again, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if *all == (len(c.args) > 0) {
		return c.usageError("give message ids or --all, not both and not neither")
	}
	ib, recs, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	if *dryRun {
		if *all {
			fmt.Fprintf(c.stdout, "would make %d dead-lettered message(s) of consumer %s eligible again in table %s\n", recs.Dead, *c.consumer, c.table)
		} else {
			n, err := ib.DeadAmong(ctx, c.args...)
			if err != nil {
				return c.explainInbox(err)
			}
			fmt.Fprintf(c.stdout, "would make %d dead-lettered message(s) of consumer %s eligible again in table %s\n", n, *c.consumer, c.table)
			if left := distinct(c.args) - n; left > 0 {
				fmt.Fprintf(c.stdout, "%d id(s) would be left alone: no dead-lettered record of this consumer (see outbox inbox dead)\n", left)
			}
		}
		fmt.Fprintln(c.stdout, "dry run: nothing changed")
		return nil
	}
	var n int64
	if *all {
		n, err = ib.RetryAllDead(ctx)
	} else {
		n, err = ib.Retry(ctx, c.args...)
	}
	if err != nil {
		return c.explainInbox(err)
	}
	fmt.Fprintf(c.stdout, "made %d dead-lettered message(s) of consumer %s eligible again in table %s\n", n, *c.consumer, c.table)
	if left := distinct(c.args) - n; !*all && left > 0 {
		fmt.Fprintf(c.stdout, "%d id(s) left alone: no dead-lettered record of this consumer (see outbox inbox dead)\n", left)
	}
	if n > 0 {
		fmt.Fprintln(c.stdout, "now replay them: "+replayHint)
	}
	return nil
}

func cmdInboxReplay(ctx context.Context, x *cli, args []string) error {
	c := newBrokerCommon("inbox replay", x) // the broker only: no --database-url
	from := c.fs.String("from", "", "the dead-letter queue to take messages from; required")
	to := c.fs.String("to", "", "the queue to put them in (default: the queue each was dead-lettered from, by its x-death header)")
	limit := c.fs.Int("limit", 1000, "most messages to move")
	dryRun := c.fs.Bool("dry-run", false, "say how many messages wait in --from, and move nothing")
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	if err := c.parse(args); err != nil {
		return err
	}
	if *from == "" {
		return c.usageError("--from is required: the dead-letter queue to replay")
	}
	if err := c.positive(map[string]int64{"limit": int64(*limit)}); err != nil {
		return err
	}
	conn, err := dialAny(ctx, c, *amqpURL, "acemq-outbox-replay")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	q, err := ch.QueueDeclarePassive(*from, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("queue %q: %w", *from, err)
	}
	_ = ch.Close()
	if *dryRun {
		fmt.Fprintf(c.stdout, "would move %d of the %d message(s) in %s back to %s\ndry run: nothing moved\n", min(q.Messages, *limit), q.Messages, *from, orDefault(*to, "the queues they were dead-lettered from"))
		return nil
	}
	n, err := inbox.Replay(ctx, conn, *from, *to, *limit)
	fmt.Fprintf(c.stdout, "moved %d message(s) from %s back to %s\n", n, *from, orDefault(*to, "the queues they were dead-lettered from"))
	return err
}

// distinct counts the different strings of ids.
func distinct(ids []string) int64 {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		seen[id] = true
	}
	return int64(len(seen))
}

// shellWord returns s as one word of a POSIX shell's command line: as it
// is when it is made of characters the shell takes literally, in single
// quotes when it holds others, and in bash's $'…' (also zsh's and ksh's)
// when it holds control characters or characters that do not print, each
// escaped, so that the word reads on one line.
func shellWord(s string) string {
	if s == "" {
		return "''"
	}
	plain, printable := true, true
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("-_.,:/@%+=", r):
		case unicode.IsControl(r) || !unicode.IsPrint(r):
			plain, printable = false, false
		default:
			plain = false
		}
	}
	switch {
	case plain:
		return s
	case printable:
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case unicode.IsControl(r) || !unicode.IsPrint(r):
			for _, c := range []byte(string(r)) {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
