// Command consumer prints the messages a relay publishes, and shows the
// consumer's half of at-least-once delivery: it skips a message whose id it
// has already handled.
//
//	go run ./examples/consumer --exchange shop --binding 'order.#'
//
// It reads AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/) and
// consumes from a temporary queue bound to the exchange until interrupted.
// A real consumer keeps the handled ids in its own database, in the same
// transaction as the work the message causes.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	exchange := flag.String("exchange", "", "exchange to bind to (required)")
	binding := flag.String("binding", "#", "binding key (topic pattern)")
	flag.Parse()
	if *exchange == "" {
		fmt.Fprintln(os.Stderr, "consumer: --exchange is required")
		flag.Usage()
		os.Exit(2)
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := consume(ctx, url, *exchange, *binding); err != nil {
		log.Fatal(err)
	}
}

func consume(ctx context.Context, url, exchange, binding string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ (AMQP_URL): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil) // server-named, exclusive
	if err != nil {
		return err
	}
	if err := ch.QueueBind(q.Name, binding, exchange, false, nil); err != nil {
		return fmt.Errorf("binding to exchange %q (does it exist?): %w", exchange, err)
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		return err
	}
	fmt.Printf("consuming %s (binding %q); Ctrl-C to stop\n", exchange, binding)
	seen := map[string]bool{} // in memory for the example; keep it durable in a real consumer
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("the broker closed the consumer")
			}
			if seen[d.MessageId] {
				fmt.Printf("duplicate %s skipped\n", d.MessageId)
			} else {
				seen[d.MessageId] = true
				fmt.Printf("%s %s key=%v %s\n", d.MessageId, d.Type, d.Headers["x-event-key"], d.Body)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
		}
	}
}
