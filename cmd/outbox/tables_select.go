package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/acemq/outbox"
)

// newOperatorCommon starts the flags of an operator command (status,
// parked, retry, discard, purge), which works on one table or several:
// --table given once for each, and --tables, a pattern that finds them
// as outbox relay's does.
func newOperatorCommon(name string, x *cli) *common {
	c := newCommon(name, x, "")
	c.fs.Var(&c.tables, "table", "the `table`, optionally schema-qualified (default "+outbox.TableDefault+"); give it once for each table to work on several")
	c.fs.StringVar(&c.pattern, "tables", "", "every outbox table whose name matches this `pattern` (* any characters, ? one), e.g. 'tenant_*.outbox'")
	return c
}

// several says whether the command was given several tables, or a
// pattern that may find several: its output then names each table.
func (c *common) several() bool { return len(c.tables) > 1 || c.pattern != "" }

// eachTable runs fn on a store of each table the command was given, in
// turn, on one pool, with c.table the table's: those of --table, in the
// order given, then those --tables finds, sorted. A table's failure is
// said on stderr and the next goes on; eachTable then returns an error
// that counts them. With one table, fn's error is returned as it is.
func (c *common) eachTable(ctx context.Context, cfg *outbox.StoreConfig, fn func(*outbox.Store) error) error {
	names := slices.Clone(c.tables)
	if len(names) == 0 && c.pattern == "" {
		names = []string{outbox.TableDefault}
	}
	for _, t := range names {
		if looksLikeDSN(t) {
			return c.usageError("--table looks like a connection string (not shown: it may hold a password); --table takes a table name, the database goes in --database-url or DATABASE_URL")
		}
	}
	if c.pattern != "" {
		if looksLikeDSN(c.pattern) {
			return c.usageError("--tables looks like a connection string (not shown: it may hold a password); --tables takes a pattern of table names, the database goes in --database-url or DATABASE_URL")
		}
		if _, err := outbox.FindTables(ctx, nil, c.pattern); !errors.Is(err, outbox.ErrNoPool) {
			return c.usageError("--tables: %s", strings.TrimPrefix(err.Error(), "outbox: FindTables: "))
		}
	}
	if cfg == nil {
		cfg = &outbox.StoreConfig{}
	}
	if !c.several() {
		c.table = names[0]
		db, store, err := c.open(ctx, cfg)
		if err != nil {
			return err
		}
		defer db.Close()
		return fn(store)
	}
	for _, t := range names { // a bad name needs no connection
		tc := *cfg
		tc.Table = t
		if _, err := outbox.NewStore(nil, &tc); err != nil {
			return err
		}
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if c.pattern != "" {
		found, err := outbox.FindTables(ctx, db, c.pattern)
		if err != nil {
			return c.explain(err)
		}
		for _, t := range found {
			if !slices.Contains(names, t) {
				names = append(names, t)
			}
		}
		if len(names) == 0 {
			return fmt.Errorf("no outbox table matches --tables %s", c.pattern)
		}
	}
	failed := 0
	for _, t := range names {
		tc := *cfg
		tc.Table = t
		if tc.Logger != nil {
			tc.Logger = tc.Logger.With(slog.String("table", t))
		}
		c.table = t
		store, err := outbox.NewStore(db, &tc)
		if err == nil {
			err = fn(store)
		}
		if err != nil {
			failed++
			if !errors.Is(err, errUsage) {
				fmt.Fprintf(c.stderr, "outbox %s: table %s: %v\n", c.name, t, c.secrets.scrub(err.Error()))
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of the %d tables failed (above)", failed, len(names))
	}
	return nil
}
