package main

import (
	"context"
	"database/sql"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/periodic"
	"github.com/acemq/outbox/pgwake"
	"github.com/acemq/outbox/relay"
)

// relayTables keeps the tables of outbox relay's group: those --table
// names, and those --tables finds, which it looks for again every
// --tables-every, adding the tables created since and letting go of the
// ones dropped. Its methods run on the command's goroutine, then on
// watch's alone.
type relayTables struct {
	c       *common
	o       *relayOptions
	db      *sql.DB
	g       *relay.Group
	base    *slog.Logger
	cfg     outbox.StoreConfig // of the tables found (Table set for each)
	metrics *metricsServer     // nil without --metrics-addr

	listener  *pgwake.Listener  // --notify's one connection for every table; made with the first
	listened  bool              // its first table's test notification was sent (see listen)
	listeners map[string]func() // --notify's subscriptions, by table
	found     map[string]bool   // the tables --tables found, in the group
	lookNow   chan struct{}     // a found table's claim failed: look before --tables-every
}

// lookOnError is the observer of a table --tables found: a claim that
// fails (most often: the table was dropped) makes the next look come at
// once, so that a dropped table is let go after an error or two of its
// relay rather than one each backoff until --tables-every.
type lookOnError struct {
	relay.Observer
	look chan<- struct{}
}

func (o lookOnError) Claimed(ctx context.Context, n int, took time.Duration, err error) {
	o.Observer.Claimed(ctx, n, took, err)
	if err != nil {
		select {
		case o.look <- struct{}{}:
		default:
		}
	}
}

// add adds st's table to the group, with its observer and, with
// --notify, its wake-ups; found says that --tables found it.
func (ts *relayTables) add(ctx context.Context, st *outbox.Store, found bool) error {
	t := relay.Table{Name: st.Table(), Store: st}
	if ts.metrics != nil {
		obs, err := ts.metrics.observe(st)
		if err != nil {
			return err
		}
		t.Observer = obs
	}
	if found {
		obs := relay.Observer(relay.NopObserver{})
		if t.Observer != nil {
			obs = t.Observer
		}
		t.Observer = lookOnError{Observer: obs, look: ts.lookNow}
	}
	if ts.o.notify {
		wake, stop, err := ts.listen(ctx, st)
		if err != nil {
			ts.forget(t.Name)
			return err
		}
		ts.listeners[t.Name] = stop
		t.Wakeup = wake
	}
	if err := ts.g.Add(t); err != nil {
		ts.forget(t.Name)
		return ts.c.usageError("%s", relayFlags.Replace(err.Error()))
	}
	return nil
}

// addFound adds a table --tables found; what fails is logged, and tried
// again at the next look.
func (ts *relayTables) addFound(ctx context.Context, name string) {
	cfg := ts.cfg
	cfg.Table = name
	cfg.Logger = ts.base.With(slog.String("table", name))
	st, err := outbox.NewStore(ts.db, &cfg)
	if err == nil {
		err = ts.add(ctx, st, true)
	}
	if err != nil {
		ts.base.Warn("relay: Cannot relay a table --tables found; trying again at the next look", slog.String("table", name),
			slog.String("error", ts.c.secrets.scrub(err.Error())), slog.Duration("retry_in", ts.o.findEvery))
		return
	}
	ts.found[name] = true
}

// remove takes a table out of the group, once its relay has shut down.
func (ts *relayTables) remove(name string) {
	ts.g.Remove(name)
	ts.forget(name)
	delete(ts.found, name)
}

// forget ends a table's wake-ups and series.
func (ts *relayTables) forget(name string) {
	if stop := ts.listeners[name]; stop != nil {
		stop()
		delete(ts.listeners, name)
	}
	if ts.metrics != nil {
		ts.metrics.forget(name)
	}
}

// watch looks for the tables of --tables every --tables-every until ctx
// ends, and, at most once a second, when a found table's claim failed. A
// look that fails is logged once, until one works again.
func (ts *relayTables) watch(ctx context.Context) {
	tick := time.NewTicker(ts.o.findEvery)
	defer tick.Stop()
	failing := false
	var poked time.Time // the last look a failed claim asked for
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-ts.lookNow:
			if !periodic.Sleep(ctx, time.Second-time.Since(poked)) {
				return
			}
			poked = time.Now()
		}
		names, err := outbox.FindTables(ctx, ts.db, ts.o.pattern)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			ts.base.Warn("relay: Looking for the tables of --tables failed; the tables found before are relayed meanwhile",
				slog.String("error", ts.c.secrets.scrub(err.Error())), slog.Duration("retry_in", ts.o.findEvery))
		case err == nil && failing:
			ts.base.Info("relay: Looking for the tables of --tables works again")
		}
		failing = err != nil
		if err == nil {
			ts.sync(ctx, names)
		}
	}
}

// sync makes the tables --tables found the group's: it adds the new
// ones, lets go of those no longer found (dropped or renamed), and
// starts again the relay of a table still found that stopped on an error
// (a permission granted since, a table mended): at most once a look.
func (ts *relayTables) sync(ctx context.Context, names []string) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, name := range slices.Sorted(maps.Keys(ts.found)) {
		if !want[name] {
			ts.remove(name)
			ts.base.Info("relay: Let go of a table --tables no longer finds (dropped or renamed)", slog.String("table", name))
		}
	}
	health := ts.g.Health()
	for _, name := range names {
		switch {
		case slices.Contains(ts.o.tables, name):
		case !ts.found[name]:
			ts.addFound(ctx, name)
			if ts.found[name] {
				ts.base.Info("relay: Relaying a new table --tables found", slog.String("table", name))
			}
		case health[name].Permanent:
			ts.remove(name)
			ts.addFound(ctx, name)
			if ts.found[name] {
				ts.base.Info("relay: Starting again the relay of a table that stopped on an error", slog.String("table", name),
					slog.String("error", ts.c.secrets.scrub(health[name].Err.Error())))
			}
		}
	}
}

// close ends every table's wake-ups and series.
func (ts *relayTables) close() {
	for name := range ts.listeners {
		ts.forget(name)
	}
}
