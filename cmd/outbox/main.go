// Command outbox runs the relay of github.com/acemq/outbox as a daemon and
// gives operators their view of an outbox table.
//
//	outbox relay   [flags]            publish the outbox to RabbitMQ until SIGINT/SIGTERM
//	outbox status  [flags]            pending, claimed, parked, oldest pending age, blocked keys
//	outbox parked  [flags]            list parked messages with their last errors
//	outbox retry   [flags] ID...      re-arm parked messages (--all-parked for all)
//	outbox discard [flags] ID...      give up on parked messages, keeping their record
//	outbox purge   --older-than 168h  delete old published messages
//	outbox schema  [--apply]          print (or create) the table's DDL (--layout rows|log)
//	outbox convert --to log           turn a rows table into a log table, online (--dry-run)
//	outbox bench   [flags]            measure throughput and latency on a scratch table
//	outbox inbox   schema|purge       the consumers' inbox table (package inbox)
//
// The database comes from --database-url or DATABASE_URL, the broker from
// --amqp-url or AMQP_URL (comma-separated for the nodes of a cluster).
//
// Install with: go install github.com/acemq/outbox/cmd/outbox@latest
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
