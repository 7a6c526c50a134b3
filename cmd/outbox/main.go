// Command outbox runs the relay of github.com/acemq/outbox as a daemon and
// gives operators their view of an outbox table.
//
//	outbox relay   [flags]            publish the outbox to RabbitMQ until SIGINT/SIGTERM
//	outbox status  [flags]            pending, claimed, parked, oldest pending age, blocked keys
//	outbox parked  [flags]            list parked messages with their last errors
//	outbox retry   [flags] ID...      re-arm parked messages (--all-parked for all)
//	outbox discard [flags] ID...      give up on parked messages, keeping their record
//	outbox scheduled [flags] [ID...]  list delayed messages (--publish-now, --discard)
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
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(ctx)
	// Without this, a write to a closed pipe (`outbox verify 2>&1 | head`)
	// kills the process with SIGPIPE, and nothing it would remove at the
	// end (verify's scratch table, queues and relays) is removed. Notified,
	// SIGPIPE only makes the write fail with EPIPE; a command whose output
	// is gone then ends as if interrupted, and cleans up.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	stdout, stderr := &pipeWriter{w: os.Stdout, broken: cancel}, &pipeWriter{w: os.Stderr, broken: cancel}
	code := run(ctx, os.Args[1:], stdout, stderr, os.Getenv)
	cancel()
	stop()
	os.Exit(code)
}

// pipeWriter calls broken when a write fails because the reader is gone.
type pipeWriter struct {
	w      io.Writer
	broken func()
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		p.broken()
	}
	return n, err
}
