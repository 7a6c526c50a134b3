package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/internal/dberr"
)

// A run of verify names its scratch objects after a random suffix: the
// table outbox_verify_<8 hex digits> and the tables beside it
// (<table>_inbox, _effects, _alive, the log layout's), the exchange and
// queues outbox.verify.<same digits> (and .inbox). A run that is killed
// (SIGKILL, a lost machine) cannot remove them; the next run does. It
// tells a run that is gone from one that is running by the run's
// heartbeat: the table <table>_alive, created before the scratch table,
// whose one row the run updates every verifyBeat. Plain statements, so
// that it works through a transaction pooler as well.
const (
	verifyTablePrefix = "outbox_verify_"
	verifyAMQPPrefix  = "outbox.verify."
	verifyBeat        = time.Second
	// verifyStale is how long a run's heartbeat may be silent before the
	// run counts as gone and its objects as leftovers.
	verifyStale = 15 * time.Second
)

// startHeartbeat creates the run's heartbeat table, before anything else
// of the run, and keeps it fresh until the returned function is called.
func (v *verifier) startHeartbeat(ctx context.Context) (stop func(), err error) {
	for _, st := range v.sql.createAlive(v.table) {
		if _, err := v.db.ExecContext(ctx, st); err != nil {
			return nil, v.c.explain(err)
		}
	}
	beat := v.sql.beat(v.table)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(verifyBeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = v.db.ExecContext(ctx, beat)
			}
		}
	}()
	return func() { close(done); <-ended }, nil
}

// keepForever marks the run's objects as kept (--keep): the heartbeat
// never goes stale, and later runs leave them to be dropped by hand.
func (v *verifier) keepForever(ctx context.Context) {
	_, _ = v.db.ExecContext(ctx, v.sql.keep(v.table))
}

// dropRun drops every table of the run of the given scratch table, the
// heartbeat last.
func (v *verifier) dropRun(ctx context.Context, table string) error {
	for _, st := range v.sql.dropRun(table) {
		if _, err := v.db.ExecContext(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// deleteRunAMQP deletes the exchange and queues of the run of the given
// suffix, each on a channel of its own (a failed operation closes its
// channel); those that do not exist are not an error.
func deleteRunAMQP(conn *amqp.Connection, sfx string) {
	name := verifyAMQPPrefix + sfx
	for _, op := range []func(ch *amqp.Channel) error{
		func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err },
		func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name+".inbox", false, false, false); return err },
		func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) },
	} {
		if ch, err := conn.Channel(); err == nil {
			_ = op(ch)
			_ = ch.Close()
		}
	}
}

// removeLeftovers removes the scratch objects of earlier runs that are
// gone: runs whose heartbeat is older than verifyStale, or that have none
// (killed before this version wrote one), and returns their tables. The
// queues and the exchange go first: a run killed meanwhile leaves its
// table, and with it the name of what is left, for the next.
func (v *verifier) removeLeftovers(ctx context.Context, conn *amqp.Connection) ([]string, error) {
	rows, err := v.db.QueryContext(ctx, v.sql.runs())
	if err != nil {
		return nil, fmt.Errorf("looking for the leftovers of earlier runs: %w", err)
	}
	var sfxs []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, fmt.Errorf("looking for the leftovers of earlier runs: %w", err)
		}
		sfxs = append(sfxs, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking for the leftovers of earlier runs: %w", err)
	}
	var removed []string
	for _, sfx := range sfxs {
		table := verifyTablePrefix + sfx
		if table == v.table {
			continue
		}
		gone, err := v.runGone(ctx, table)
		if err != nil {
			return removed, err
		}
		if !gone {
			continue
		}
		deleteRunAMQP(conn, sfx)
		if err := v.dropRun(ctx, table); err != nil {
			return removed, fmt.Errorf("removing the leftovers of an earlier run (%s): %w", table, err)
		}
		removed = append(removed, table)
	}
	return removed, nil
}

// runGone says whether the run of the given scratch table has ended
// without removing its objects: its heartbeat is stale, or missing.
func (v *verifier) runGone(ctx context.Context, table string) (bool, error) {
	var has bool
	query, arg := v.sql.hasAlive(table)
	if err := v.db.QueryRowContext(ctx, query, arg).Scan(&has); err != nil {
		return false, fmt.Errorf("reading the heartbeat of %s: %w", table, err)
	}
	if !has {
		return true, nil
	}
	var stale sql.NullBool
	err := v.db.QueryRowContext(ctx, v.sql.stale(table), verifyStale.Microseconds()).Scan(&stale)
	switch {
	case dberr.Classify(err) == dberr.NoTable:
		return false, nil // removed meanwhile, by its run or another
	case err != nil:
		return false, fmt.Errorf("reading the heartbeat of %s: %w", table, err)
	}
	return !stale.Valid || stale.Bool, nil
}
