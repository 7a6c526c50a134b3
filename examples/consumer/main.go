// Command consumer is the consumer's half of the outbox: it applies each
// message a relay publishes exactly once, through an inbox (package inbox).
//
//	go run ./examples/consumer --exchange shop --binding 'order.#'
//
// It declares a durable queue (--queue, default "examples.consumer") bound
// to the exchange, with a dead-letter queue ("<queue>.dead") that receives
// what the inbox dead-letters (without one the broker would drop it), creates an inbox table and an effects table in
// DATABASE_URL's database, and consumes until interrupted: each message's
// effect (a row in consumer_effects) commits together with the inbox's
// record of its id, and only then is the message acked. A message
// delivered again, by the broker or by a relay that published it twice, is
// acked without a second effect. It reads AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/) and DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/inbox"
)

func main() {
	exchange := flag.String("exchange", "", "exchange to bind to (required)")
	binding := flag.String("binding", "#", "binding key (topic pattern)")
	queue := flag.String("queue", "examples.consumer", "durable queue to consume")
	flag.Parse()
	if *exchange == "" {
		fmt.Fprintln(os.Stderr, "consumer: --exchange is required")
		flag.Usage()
		os.Exit(2)
	}
	amqpURL := env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	dbURL := env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := consume(ctx, dbURL, amqpURL, *exchange, *binding, *queue); err != nil {
		log.Fatal(err)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func consume(ctx context.Context, dbURL, amqpURL, exchange, binding, queue string) error {
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	ib, err := inbox.New(db, &inbox.Config{Consumer: "examples-consumer"})
	if err != nil {
		return err
	}
	if err := ib.CreateSchemaIfAbsent(ctx); err != nil { // in production: a migration (inbox/migrations)
		return fmt.Errorf("creating the inbox table (DATABASE_URL): %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS consumer_effects (message_id text NOT NULL, type text, body bytea)`); err != nil {
		return err
	}

	// The queue and its binding; the inbox's consumer does the rest.
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ (AMQP_URL): %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// What the inbox dead-letters goes to <queue>.dead through the default
	// exchange; `outbox inbox replay --from <queue>.dead` brings it back.
	if _, err := ch.QueueDeclare(queue+".dead", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue + ".dead",
	}); err != nil {
		return fmt.Errorf("declaring queue %q (an older run may have declared it without a dead-letter queue: delete it, or pass another --queue): %w", queue, err)
	}
	if err := ch.QueueBind(queue, binding, exchange, false, nil); err != nil {
		return fmt.Errorf("binding to exchange %q (does it exist?): %w", exchange, err)
	}
	conn.Close()

	effect := func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		fmt.Printf("%s %s key=%v %s\n", d.MessageId, d.Type, d.Headers["x-event-key"], d.Body)
		_, err := tx.ExecContext(ctx, `INSERT INTO consumer_effects VALUES ($1, $2, $3)`, d.MessageId, d.Type, d.Body)
		return err
	}
	c, err := ib.Consumer(&inbox.ConsumerConfig{Queue: queue, Handler: effect, URLs: []string{amqpURL}})
	if err != nil {
		return err
	}
	fmt.Printf("consuming %s (binding %q) through queue %s; Ctrl-C to stop\n", exchange, binding, queue)
	if err := c.Run(ctx); err != nil {
		return err
	}
	st := c.Stats()
	fmt.Printf("applied %d effects exactly once; %d duplicates acked without a second effect; %d dead-lettered to %s.dead\n",
		st.Handled, st.Duplicates, st.DeadLettered+st.Refused, queue)
	return nil
}
