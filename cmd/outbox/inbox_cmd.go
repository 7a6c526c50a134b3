package main

import (
	"context"
	"fmt"

	"github.com/acemq/outbox/inbox"
)

const inboxUsage = `Usage:
  outbox inbox schema [--table inbox] [--apply]                  print (or create) the inbox table's DDL
  outbox inbox purge  --consumer NAME --older-than 720h [--dry-run]  delete old records of handled messages
`

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
	ddl, err := inbox.Schema(c.table)
	if err != nil {
		return err
	}
	return c.printOrApply(ctx, ddl, *apply)
}

func cmdInboxPurge(ctx context.Context, x *cli, args []string) error {
	c := newCommon("inbox purge", x, inbox.TableDefault)
	consumer := c.fs.String("consumer", "", "the consumer whose records to purge; required")
	olderThan := c.fs.Duration("older-than", 0, "delete records of messages handled or dead-lettered longer ago than this (e.g. 720h); required. Keep them longer than a message may be redelivered")
	dryRun := c.fs.Bool("dry-run", false, "say how many records would be deleted, and do nothing")
	if err := c.parse(args); err != nil {
		return err
	}
	if *consumer == "" || *olderThan <= 0 {
		return c.usageError("--consumer and a positive --older-than are required, e.g. --consumer billing --older-than 720h")
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	ib, err := inbox.New(db, &inbox.Config{Consumer: *consumer, Table: c.table})
	if err != nil {
		return err
	}
	due, err := ib.Purgeable(ctx, *olderThan)
	if err != nil {
		return c.explain(err)
	}
	fmt.Fprintf(c.stderr, "purging %d record(s) of consumer %s older than %s from table %s\n", due, *consumer, *olderThan, c.table)
	if *dryRun {
		fmt.Fprintln(c.stdout, "dry run: nothing deleted")
		return nil
	}
	n, err := ib.Purge(ctx, *olderThan)
	if err != nil {
		return fmt.Errorf("after purging %d: %w", n, c.explain(err))
	}
	fmt.Fprintf(c.stdout, "purged %d record(s) of consumer %s from table %s\n", n, *consumer, c.table)
	return nil
}
