// Package demo is the scaffolding the examples share: connections with
// local defaults, a schema and an exchange of their own that are removed
// afterwards, an in-process relay and a consumer that applies each event's
// effect exactly once through an inbox (package inbox).
// The interesting code is in the examples themselves.
package demo

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"   // and the "mysql" database/sql driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/relay"
)

// Env returns the environment variable or its default.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// DatabaseURL and AMQPURL are where the examples connect.
var (
	DatabaseURL = Env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	AMQPURL     = Env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
)

// MySQL says whether DATABASE_URL is MySQL's or MariaDB's (a mysql://
// URL or a go-sql-driver DSN) rather than PostgreSQL's.
func MySQL() bool {
	_, ok := mysqlDSN(DatabaseURL, "")
	return ok
}

// mysqlDSN returns the go-sql-driver DSN of url, a mysql:// URL or a DSN,
// with its database set to db ("": as given); ok is false for any other.
func mysqlDSN(s, db string) (dsn string, ok bool) {
	var cfg *mysql.Config
	if rest, found := strings.CutPrefix(s, "mysql://"); found {
		u, err := url.Parse("mysql://" + rest)
		if err != nil {
			return "", false
		}
		cfg = mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	} else if c, err := mysql.ParseDSN(s); err == nil && strings.Contains(s, "@tcp(") {
		cfg = c
	} else {
		return "", false
	}
	if db != "" {
		cfg.DBName = db
	}
	return cfg.FormatDSN(), true
}

// Run is one example run.
type Run struct {
	DB       *sql.DB
	Schema   string // a PostgreSQL schema (a MySQL database) of this run's own
	Exchange string // a topic exchange of this run's own, bound to Queue
	Queue    string

	conn     *amqp.Connection
	mu       sync.Mutex
	received map[string]bool
	total    int
}

// Start connects, creates the run's schema with its outbox table, declares
// the exchange and queue, and starts consuming. Close undoes it all.
func Start(ctx context.Context, name string) (*Run, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	r := &Run{Schema: "example_" + name + "_" + suffix, Exchange: "examples." + name + "." + suffix, received: map[string]bool{}}

	driver, dsn, server := "pgx", DatabaseURL, "PostgreSQL"
	if d, ok := mysqlDSN(DatabaseURL, ""); ok {
		driver, dsn, server = "mysql", d, "MySQL/MariaDB"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("cannot reach %s (DATABASE_URL): %w; start it with `docker compose up -d --wait`", server, err)
	}
	r.DB = db
	create := `CREATE SCHEMA "` + r.Schema + `"`
	if MySQL() {
		create = "CREATE DATABASE `" + r.Schema + "`"
	}
	if _, err := db.ExecContext(ctx, create); err != nil {
		return nil, err
	}
	// In production the table is your migrations' (migrations/, or
	// migrations/mysql/): on PostgreSQL the default layout, log.
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: r.Schema + ".outbox"})
	if err != nil {
		return nil, err
	}
	if err := store.CreateSchemaIfAbsent(ctx); err != nil {
		return nil, err
	}

	conn, err := amqp.Dial(AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ (AMQP_URL): %w; start it with `docker compose up -d --wait`", err)
	}
	r.conn = conn
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.ExchangeDeclare(r.Exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil) // server-named, exclusive
	if err != nil {
		return nil, err
	}
	r.Queue = q.Name
	if err := ch.QueueBind(q.Name, "#", r.Exchange, false, nil); err != nil {
		return nil, err
	}
	// The consumer applies each event's effect exactly once through an
	// inbox: its record of handled message ids commits with the effect.
	ib, err := inbox.New(db, &inbox.Config{Consumer: "demo-billing", Table: r.Schema + ".inbox"})
	if err != nil {
		return nil, err
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil {
		return nil, err
	}
	table := r.invoices()
	invoices, insert := `CREATE TABLE `+table+` (message_id text NOT NULL, body jsonb)`,
		// The body as text, cast in SQL: a []byte would travel as bytea in
		// pgx's exec and simple_protocol modes (what poolers need).
		`INSERT INTO `+table+` VALUES ($1, $2::text::jsonb)`
	if MySQL() {
		invoices, insert = "CREATE TABLE "+table+" (message_id VARCHAR(255) NOT NULL, body JSON)",
			"INSERT INTO "+table+" VALUES (?, ?)"
	}
	if _, err := db.ExecContext(ctx, invoices); err != nil {
		return nil, err
	}
	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, insert, d.MessageId, string(d.Body))
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		for d := range deliveries {
			r.mu.Lock()
			if r.total < 3 {
				fmt.Printf("consumer: %s %s id=%s %s\n", d.RoutingKey, d.Timestamp.Format(time.TimeOnly), d.MessageId, d.Body)
			} else if r.total == 3 {
				fmt.Println("consumer: ...")
			}
			r.total++
			r.mu.Unlock()
			if o, err := ib.Handle(context.Background(), &d, effect); err == nil && (o == inbox.Handled || o == inbox.Duplicate) {
				r.mu.Lock()
				r.received[d.MessageId] = true
				r.mu.Unlock()
			}
		}
	}()
	return r, nil
}

// StartRelay runs a relay on the run's outbox table until ctx ends and
// returns a function that stops it and waits.
func (r *Run) StartRelay(ctx context.Context, logger *slog.Logger) (stop func(), err error) {
	store, err := outbox.NewStore(r.DB, &outbox.StoreConfig{Table: r.Schema + ".outbox", Logger: logger})
	if err != nil {
		return nil, err
	}
	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: AMQPURL, Logger: logger})
	if err != nil {
		return nil, err
	}
	rl, err := relay.New(store, pub, &relay.Config{PollInterval: 50 * time.Millisecond, Logger: logger})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rl.Run(ctx)
		_ = pub.Close()
	}()
	return func() { cancel(); <-done }, nil
}

// Received returns how many distinct messages arrived.
func (r *Run) Received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.received)
}

// Await waits until want messages arrived or the timeout passed.
func (r *Run) Await(want int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for r.Received() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return r.Received()
}

// Published counts the run's outbox messages published (the outbox table
// has the default layout, the log layout: its _messages view says what
// became of each event).
func (r *Run) Published(ctx context.Context) (int, error) {
	var n int
	q := `SELECT count(*) FROM "` + r.Schema + `".outbox_messages WHERE published_at IS NOT NULL`
	if MySQL() { // one layout, one row per message
		q = "SELECT count(*) FROM `" + r.Schema + "`.outbox WHERE published_at IS NOT NULL"
	}
	err := r.DB.QueryRowContext(ctx, q).Scan(&n)
	return n, err
}

// Close drops the schema and closes the connections (the exchange and
// queue go with the connection).
func (r *Run) Close() {
	if r.conn != nil {
		r.conn.Close()
	}
	if r.DB != nil {
		drop := `DROP SCHEMA IF EXISTS "` + r.Schema + `" CASCADE`
		if MySQL() {
			drop = "DROP DATABASE IF EXISTS `" + r.Schema + "`"
		}
		_, _ = r.DB.Exec(drop)
		r.DB.Close()
	}
}

// SchemaDB opens a pool whose unqualified table names resolve in the run's
// schema, for ent, which does not qualify its tables.
func (r *Run) SchemaDB() (*sql.DB, error) {
	if dsn, ok := mysqlDSN(DatabaseURL, r.Schema); ok {
		return sql.Open("mysql", dsn)
	}
	u, err := url.Parse(DatabaseURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", r.Schema)
	u.RawQuery = q.Encode()
	return sql.Open("pgx", u.String())
}

// ErrOutOfStock is the business failure the examples use to roll back.
var ErrOutOfStock = errors.New("out of stock")

// PlaceOrders places n orders through place, telling every tenth to fail
// with ErrOutOfStock, waits for the events of the others to arrive, stops
// the relay and prints the summary line. It fails if an event was lost or
// one of a rolled-back order was published.
func (r *Run) PlaceOrders(ctx context.Context, n int, stopRelay func(), place func(customer string, total int, outOfStock bool) error) error {
	committed, rolledBack := 0, 0
	for i := range n {
		err := place(fmt.Sprintf("customer-%d", i%7), 100+i, i%10 == 9)
		switch {
		case errors.Is(err, ErrOutOfStock):
			rolledBack++
		case err != nil:
			return err
		default:
			committed++
		}
	}
	received := r.Await(committed, time.Minute)
	stopRelay()
	published, err := r.Published(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	duplicates := r.total - len(r.received)
	r.mu.Unlock()
	fmt.Printf("placed %d orders (%d rolled back): %d events published, %d received, %d lost\n",
		n, rolledBack, published, received, committed-received)
	if duplicates > 0 {
		fmt.Printf("(%d delivered twice: consumers deduplicate on the message id)\n", duplicates)
	}
	if received != committed || published != committed {
		return fmt.Errorf("expected exactly %d events published and received", committed)
	}
	var effects, distinct int
	if err := r.DB.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+r.invoices()).Scan(&effects, &distinct); err != nil {
		return err
	}
	fmt.Printf("consumer (inbox): %d effects applied, %d of them more than once\n", effects, effects-distinct)
	if effects != committed || distinct != committed {
		return fmt.Errorf("expected %d effects, each applied once", committed)
	}
	return nil
}

// invoices is the consumer's table of effects, quoted for the database
// (the schema is the run's own name, letters, digits and underscores).
func (r *Run) invoices() string {
	if MySQL() {
		return "`" + r.Schema + "`.invoices"
	}
	return `"` + r.Schema + `".invoices`
}
