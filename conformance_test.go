package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// The conformance suite (issues 40 and 41): the store's semantics, each
// test run on every backend, through the public API only (TestConform…).
// A test that needs SQL of a backend's own stays with that backend's
// tests (mysql_test.go, log_test.go, …).

// backendCase is one backend the suite runs on.
type backendCase struct {
	name  string
	mysql bool // MySQL/MariaDB (TEST_MYSQL_DSN)
	log   bool // PostgreSQL's log layout, else its rows layout
}

var backendCases = []backendCase{{name: "postgres-rows"}, {name: "postgres-log", log: true}, {name: "mysql", mysql: true}}

// layout is the layout a backend's tables have.
func (b backendCase) layout() outbox.Layout {
	if b.log {
		return outbox.LayoutLog
	}
	return outbox.LayoutRows
}

// onEveryBackend runs fn as a parallel subtest on each backend, with a
// store on a table of its own, made from cfg (nil: the defaults), its
// table created (ordered when the configuration is).
func onEveryBackend(t *testing.T, cfg func() *outbox.StoreConfig, fn func(t *testing.T, db *sql.DB, s *outbox.Store, b backendCase)) {
	for _, b := range backendCases {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := &outbox.StoreConfig{}
			if cfg != nil {
				c = cfg()
			}
			db, s := openOn(t, b, c)
			fn(t, db, s, b)
		})
	}
}

// orderedCfg returns cfg's configuration (nil: the defaults) in ordered mode.
func orderedCfg(cfg *outbox.StoreConfig) func() *outbox.StoreConfig {
	return func() *outbox.StoreConfig {
		c := &outbox.StoreConfig{}
		if cfg != nil {
			*c = *cfg
		}
		c.Ordering = outbox.OrderedByKey
		return c
	}
}

func openOn(t *testing.T, b backendCase, cfg *outbox.StoreConfig) (*sql.DB, *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	if b.mysql {
		return mysqlStore(t, cfg)
	}
	db := dbtest.DB(t)
	cfg.Table = dbtest.Table(t)
	s, err := outbox.NewStore(db, cfg)
	require.NoError(t, err)
	require.Equal(t, outbox.PostgreSQL, s.Database())
	create := s.CreateRowsSchemaIfAbsent
	if b.log {
		create = s.CreateLogSchemaIfAbsent
	}
	require.NoError(t, create(ctx))
	if cfg.Ordering == outbox.OrderedByKey {
		o, err := s.TableOrdering(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.OrderedByKey, o)
		require.NoError(t, s.CheckOrdering(ctx))
	}
	return db, s
}
