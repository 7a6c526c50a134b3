package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/relay"
)

// poolerURL returns the test database behind a transaction pooler
// (OUTBOX_POOLER_URL, which .ci/pooler-smoke sets after starting PgBouncer
// from Debian in pool_mode = transaction) with pgx's exec mode set, or
// skips the test.
func poolerURL(t *testing.T, mode string) string {
	t.Helper()
	raw := os.Getenv("OUTBOX_POOLER_URL")
	if raw == "" {
		t.Skip("OUTBOX_POOLER_URL is not set: no transaction pooler to test through (.ci/pooler-smoke starts one)")
	}
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

// Issue 23: `outbox relay --ordered` through PgBouncer in transaction mode,
// written by ordered stores through it too, delivers every event in the
// order of its key.
func TestPoolerRelayOrdered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_describe", "exec"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dsn := poolerURL(t, mode)
			ctx := context.Background()
			conn := amqptest.Conn(t)
			top := amqptest.Declare(t, conn)
			log := amqptest.NewOrderLog()
			consumer := amqptest.ConsumeFunc(t, conn, top.Queue, log.Record)
			db, err := sql.Open("pgx", dsn)
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			table := dbtest.Table(t)
			store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, Router: outbox.ToExchange(top.Exchange), Ordering: outbox.OrderedByKey, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))

			var stderr dbtest.Buffer
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan int, 1)
			go func() {
				done <- run(rctx, []string{"relay", "--table", table, "--ordered", "--poll-interval", "10ms"}, &dbtest.Buffer{}, &stderr, func(k string) string {
					return map[string]string{"DATABASE_URL": dsn, "AMQP_URL": amqptest.URL()}[k]
				})
			}()
			const writers, perWriter, keys = 4, 75, 10
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						tx, err := db.BeginTx(ctx, nil)
						if !assertNoError(t, err) {
							return
						}
						if !assertNoError(t, store.Add(ctx, tx, outbox.Event{Type: "order.changed", Key: fmt.Sprint("order-", (w*perWriter+i)%keys)})) {
							_ = tx.Rollback()
							return
						}
						assertNoError(t, tx.Commit())
					}
				}()
			}
			wg.Wait()
			require.Eventually(t, func() bool { return consumer.Distinct() == writers*perWriter }, time.Minute, 10*time.Millisecond, stderr.String())
			cancel()
			require.Equal(t, 0, <-done, stderr.String())
			want := dbtest.IDsByKey(t, dbtest.DB(t), `"`+table+`"`)
			got := log.Keys()
			for key, ids := range want {
				require.Equal(t, ids, got[key], "key %s", key)
			}
			require.NotContains(t, stderr.String(), "prepared statement")
		})
	}
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// Issue 23: the inbox's consumer through PgBouncer in transaction mode
// applies every message once, duplicates and all, in pgx's modes that work
// there.
func TestPoolerInboxConsumer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db, err := sql.Open("pgx", poolerURL(t, mode))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			ctx := context.Background()
			table := dbtest.Table(t)
			_, err = db.Exec(`CREATE TABLE "` + table + `_effects" (message_id text NOT NULL, body jsonb NOT NULL)`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = dbtest.DB(t).Exec(`DROP TABLE IF EXISTS "` + table + `_effects"`) })
			ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: table, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
			ch, err := amqptest.Conn(t).Channel()
			require.NoError(t, err)
			q := amqptest.Name(t, "q")
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
			const n = 100
			for i := range n {
				for range 1 + i%2 {
					require.NoError(t, ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: fmt.Sprint("m-", i), Body: []byte(`{"n":1}`)}))
				}
			}
			effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`_effects" VALUES ($1, $2::text::jsonb)`, d.MessageId, string(d.Body))
				return err
			}
			c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: q, Handler: effect, URLs: []string{amqptest.URL()}, Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(rctx) }()
			require.Eventually(t, func() bool { st := c.Stats(); return st.Handled == n && st.Duplicates == n/2 }, time.Minute, 10*time.Millisecond)
			cancel()
			require.NoError(t, <-done)
			require.EqualValues(t, n, dbtest.Count(t, dbtest.DB(t), `SELECT count(DISTINCT message_id) FROM "`+table+`_effects"`))
			require.EqualValues(t, n, dbtest.Count(t, dbtest.DB(t), `SELECT count(*) FROM "`+table+`_effects"`))
		})
	}
}

// Issue 23: `outbox relay --notify` through a transaction pooler says that
// LISTEN receives nothing there; with a direct --listen-database-url it
// does not.
func TestPoolerNotifyWarns(t *testing.T) {
	t.Parallel()
	dsn := poolerURL(t, "cache_describe")
	table := dbtest.Table(t)
	code, _, errOut := outboxCmd(t, nil, "schema", "--table", table, "--notify", "--apply")
	require.Equal(t, 0, code, errOut)
	for _, listen := range []string{"", dbtest.URL()} {
		var stderr dbtest.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		args := []string{"relay", "--table", table, "--notify"}
		if listen != "" {
			args = append(args, "--listen-database-url", listen)
		}
		go func() {
			done <- run(ctx, args, &dbtest.Buffer{}, &stderr, func(k string) string {
				return map[string]string{"DATABASE_URL": dsn, "AMQP_URL": amqptest.URL()}[k]
			})
		}()
		require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "relay: Started") }, 20*time.Second, 10*time.Millisecond)
		cancel()
		require.Equal(t, 0, <-done, stderr.String())
		if listen == "" {
			require.Contains(t, stderr.String(), "LISTEN does not work through a transaction pooler")
		} else {
			require.NotContains(t, stderr.String(), "LISTEN does not work", "a direct listener receives the probe")
		}
	}
}

// Issue 23: an error that shows a pooler in the way of pgx's statement
// cache comes with the fix, wherever it surfaces.
func TestPoolerHint(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"42P05", "26000"} {
		err := fmt.Errorf("claiming: %w", &pgconn.PgError{Code: code, Message: "prepared statement \"stmtcache_1\" already exists"})
		require.Contains(t, relay.Advice(err), "default_query_exec_mode=cache_describe")
		c := &common{table: "outbox"}
		require.ErrorContains(t, c.explain(err), "default_query_exec_mode=cache_describe")
		var pg *pgconn.PgError
		require.True(t, errors.As(c.explain(err), &pg), "the error stays inspectable")
	}
}
