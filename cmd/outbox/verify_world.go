package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/redact"
	"github.com/acemq/outbox/internal/tcpproxy"
	"github.com/acemq/outbox/topology"
)

// declare declares the scratch exchange and its queues (classic, no
// dead-letter queue: they are removed at the end) with package topology.
func (v *verifier) declare(ctx context.Context, conn *amqp.Connection) error {
	queues := []string{v.queue}
	if v.o.inbox {
		queues = append(queues, v.queue+".inbox")
	}
	t := &topology.Topology{Exchanges: []topology.Exchange{{Name: v.exchange}}}
	for _, q := range queues {
		t.Queues = append(t.Queues, topology.Queue{Name: q, Classic: true, NoDeadLetter: true,
			Bindings: []topology.Binding{{Exchange: v.exchange, Key: "#"}}})
	}
	return t.Declare(ctx, conn)
}

// proxies starts the TCP proxies and returns the relays' URLs through them.
func (v *verifier) proxies() (dbURL, amqpURL string, err error) {
	if v.sql.mysql {
		dbURL, err = v.mysqlProxy()
	} else {
		dbURL, err = v.pgProxy()
	}
	if err != nil {
		return "", "", err
	}
	uri, err := amqp.ParseURI(v.amqpURL)
	if err != nil {
		return "", "", errors.New("the AMQP URL: " + redact.Reason(err))
	}
	if v.amqpProxy, err = tcpproxy.New(net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))); err != nil {
		return "", "", err
	}
	uri.Host, uri.Port = "127.0.0.1", v.amqpProxy.Addr().Port
	return dbURL, uri.String(), nil
}

// mysqlProxy starts the database's proxy and returns the relays' DSN
// through it. The relays' sessions are those that come through it
// (terminate-db finds them by their client ports).
func (v *verifier) mysqlProxy() (string, error) {
	dsn, _, err := mysqlDSN(v.dbURL)
	if err != nil { // checked by openDB already
		return "", err
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", errors.New("the database URL: " + redact.Reason(err))
	}
	if cfg.Net != "tcp" {
		return "", errors.New("the database URL names a Unix socket: verify's proxy needs a TCP address (tcp(host:port))")
	}
	if v.dbProxy, err = tcpproxy.New(cfg.Addr); err != nil {
		return "", err
	}
	cfg.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(v.dbProxy.Addr().Port))
	return cfg.FormatDSN(), nil
}

// pgProxy starts the database's proxy and returns the relays' URL through
// it, with an application_name of their own (the sessions terminate-db
// ends).
func (v *verifier) pgProxy() (string, error) {
	pc, err := pgconn.ParseConfig(v.dbURL)
	if err != nil { // checked by openDB already; never quoted
		return "", errors.New("the database URL: " + redact.Reason(err))
	}
	if strings.HasPrefix(pc.Host, "/") {
		return "", errors.New("the database URL names a Unix socket: verify's proxy needs a TCP host (host=…)")
	}
	if v.dbProxy, err = tcpproxy.New(net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))); err != nil {
		return "", err
	}
	port := v.dbProxy.Addr().Port
	if !strings.Contains(v.dbURL, "://") { // later keywords win
		return fmt.Sprintf("%s host=127.0.0.1 port=%d application_name=%s", v.dbURL, port, v.relayName()), nil
	}
	u, err := url.Parse(v.dbURL)
	if err != nil {
		return "", errors.New("the database URL: " + redact.Reason(err))
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	q := u.Query()
	q.Set("application_name", v.relayName()) // the sessions terminate-db ends
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// consume records every delivery of the queue: its first arrival, per key
// the order of first deliveries, and every later one (a duplicate) with
// when it came. It reconnects when the broker goes away (a broker-outage
// fault), until the returned function stops it.
func (v *verifier) consume(ctx context.Context) (func(), error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := v.consumeOnce(cctx)
	if err != nil {
		cancel()
		return nil, err
	}
	var current atomic.Pointer[amqp.Connection]
	current.Store(ch.conn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			v.record(ch.deliveries)
			_ = ch.conn.Close()
			if cctx.Err() != nil {
				return
			}
			// The broker went away: come back as soon as it answers.
			for delay := 100 * time.Millisecond; ; delay = min(2*delay, time.Second) {
				next, err := v.consumeOnce(cctx)
				if err == nil {
					ch = next
					current.Store(ch.conn)
					break
				}
				select {
				case <-cctx.Done():
					return
				case <-time.After(delay):
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			_ = current.Load().Close()
			<-done
		})
	}, nil
}

type consumerConn struct {
	conn       *amqp.Connection
	deliveries <-chan amqp.Delivery
}

func (v *verifier) consumeOnce(ctx context.Context) (consumerConn, error) {
	conn, err := v.c.dialFirst(ctx, v.dialer.Named("outbox-verify-consumer"), v.amqpURL)
	if err != nil {
		return consumerConn{}, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(500, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(v.queue, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return consumerConn{}, err
	}
	return consumerConn{conn, deliveries}, nil
}

// record takes deliveries until their channel closes.
func (v *verifier) record(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		now := time.Now()
		key, _ := d.Headers[outbox.KeyHeader].(string)
		v.mu.Lock()
		v.deliveries++
		if first, seen := v.arrived[d.MessageId]; !seen {
			v.arrived[d.MessageId] = now
			v.firstByKey[key] = append(v.firstByKey[key], d.MessageId)
		} else {
			v.dups = append(v.dups, duplicate{id: d.MessageId, first: first, at: now, redelivered: d.Redelivered})
		}
		v.mu.Unlock()
		_ = d.Ack(false)
	}
}

// consumeInbox consumes the second queue through an inbox whose effect is
// a row per message.
func (v *verifier) consumeInbox(ctx context.Context) (func(), error) {
	create, insert, _ := v.sql.effects(v.table)
	if _, err := v.db.ExecContext(ctx, create); err != nil {
		return nil, err
	}
	ib, err := inbox.New(v.db, &inbox.Config{Consumer: "verify", Table: v.table + "_inbox", Logger: v.quiet()})
	if err != nil {
		return nil, err
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil {
		return nil, err
	}
	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, insert, d.MessageId)
		return err
	}
	c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: v.queue + ".inbox", Handler: effect, URLs: []string{v.amqpURL}, Logger: v.quiet()})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	return func() { cancel(); <-done }, nil
}

// quiet is a logger for verify's own consumer: errors only.
func (v *verifier) quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(v.c.stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// write commits one event per transaction at the configured rate, rolling
// back some on purpose, until end. The end is checked between
// transactions, never by cancelling one: a COMMIT cut short by a context
// may still land on the server after the writer gave up on it.
func (v *verifier) write(ctx context.Context, store *outbox.Store, end time.Time) error {
	g, gctx := errgroup.WithContext(ctx)
	for w := range v.o.writers {
		g.Go(func() error { return v.writeShare(gctx, store, end, w) })
	}
	return g.Wait()
}

// writeShare is writer w's share of write: every writers-th event, the
// long transaction with the first.
func (v *verifier) writeShare(ctx context.Context, store *outbox.Store, end time.Time, w int) error {
	if v.o.longTx && w == 0 {
		// One transaction open for the whole run, committed after the
		// others: its event must arrive, after every window of
		// transactions that committed meanwhile went by.
		tx, err := v.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		added, err := store.AddIDs(ctx, tx, outbox.Event{Type: "verify.long", Payload: []byte(`{"long":true}`)})
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		v.mu.Lock()
		v.written++
		v.mu.Unlock()
		defer func() {
			if tx.Commit() == nil {
				v.mu.Lock()
				v.committed[added[0]] = time.Now()
				v.mu.Unlock()
			}
		}()
	}
	interval := time.Duration(float64(time.Second) * float64(v.o.writers) / v.o.rate)
	next := time.Now()
	for i := w; time.Now().Before(end); i += v.o.writers {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		next = next.Add(interval)
		rollback := mrand.IntN(100) < v.o.rollbackPct
		tx, err := v.db.BeginTx(ctx, nil)
		if err != nil {
			return cmp.Or(ctx.Err(), err)
		}
		evt := outbox.Event{Type: "verify.event", Key: fmt.Sprint("key-", i%v.o.keys), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		added, err := store.AddIDs(ctx, tx, evt)
		if err != nil {
			_ = tx.Rollback()
			return cmp.Or(ctx.Err(), err)
		}
		id := added[0]
		v.mu.Lock()
		v.written++
		v.mu.Unlock()
		if rollback {
			_ = tx.Rollback()
			v.mu.Lock()
			v.rolledBack++
			v.mu.Unlock()
			continue
		}
		if err := tx.Commit(); err != nil {
			// Unknown whether it committed: the report reads the table.
			continue
		}
		now := time.Now()
		v.mu.Lock()
		v.committed[id] = now
		v.mu.Unlock()
	}
	return nil
}
