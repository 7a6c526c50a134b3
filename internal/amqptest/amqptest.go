// Package amqptest gives tests the real RabbitMQ named by TEST_AMQP_URL: an
// exchange and a queue of their own, a consumer that records what arrives,
// and a TCP proxy that can cut connections. A broker that cannot be reached
// fails the test with instructions; it is never a silent skip.
package amqptest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URLDefault is used when TEST_AMQP_URL is not set.
const URLDefault = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the test broker URL.
func URL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return URLDefault
}

// Conn opens a connection of the test's own, closed when the test ends.
func Conn(tb testing.TB) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		tb.Fatalf("amqptest: cannot connect to RabbitMQ at TEST_AMQP_URL (default %s): %v\n"+
			"Is it running? Start it with `docker compose up -d --wait rabbitmq`, or on a Debian host with "+
			"`rabbitmq-server -detached`.", strings.Replace(URLDefault, "guest:guest@", "", 1), err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

var nonName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// Name returns a name no other test uses, with the given prefix.
func Name(tb testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonName.ReplaceAllString(tb.Name(), ".")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return prefix + "." + name + "." + hex.EncodeToString(b[:])
}

// Topology is a topic exchange with one queue bound to it.
type Topology struct {
	Exchange string
	Queue    string
}

// Declare declares a topic exchange and a queue bound to it for the routing
// keys given (default "#", everything), and deletes both when the test ends.
func Declare(tb testing.TB, conn *amqp.Connection, keys ...string) Topology {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	defer ch.Close()
	top := Topology{Exchange: Name(tb, "x"), Queue: Name(tb, "q")}
	if err := ch.ExchangeDeclare(top.Exchange, amqp.ExchangeTopic,
		false, // durable
		false, // auto-delete
		false, // internal
		false, // no-wait
		nil); err != nil {
		tb.Fatalf("amqptest: declaring exchange: %v", err)
	}
	if _, err := ch.QueueDeclare(top.Queue,
		false, // durable
		false, // auto-delete
		false, // exclusive
		false, // no-wait
		nil); err != nil {
		tb.Fatalf("amqptest: declaring queue: %v", err)
	}
	if len(keys) == 0 {
		keys = []string{"#"}
	}
	for _, k := range keys {
		if err := ch.QueueBind(top.Queue, k, top.Exchange, false, nil); err != nil {
			tb.Fatalf("amqptest: binding queue: %v", err)
		}
	}
	tb.Cleanup(func() {
		conn, err := amqp.Dial(URL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(top.Queue, false, false, false)
			_ = ch.ExchangeDelete(top.Exchange, false, false)
			ch.Close()
		}
	})
	return top
}

// ManualQueue declares an auto-deleted queue of the test's own and
// consumes it with manual acks on a channel of its own, for tests that ack
// or reject deliveries themselves (an inbox, say). It returns the channel,
// to publish on, the queue's name and the deliveries.
func ManualQueue(tb testing.TB, prefix string) (*amqp.Channel, string, <-chan amqp.Delivery) {
	tb.Helper()
	ch, err := Conn(tb).Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	queue := Name(tb, prefix)
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		tb.Fatalf("amqptest: declaring queue: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		tb.Fatalf("amqptest: consuming: %v", err)
	}
	return ch, queue, deliveries
}

// Exchange declares an auto-deleted topic exchange of the test's own,
// internal (no client may publish to it) if asked, deleted when the test
// ends.
func Exchange(tb testing.TB, prefix string, internal bool) string {
	tb.Helper()
	ch, err := Conn(tb).Channel()
	if err != nil {
		tb.Fatalf("amqptest: opening channel: %v", err)
	}
	name := Name(tb, prefix)
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, false, true, internal, false, nil); err != nil {
		tb.Fatalf("amqptest: declaring exchange: %v", err)
	}
	tb.Cleanup(func() { _ = ch.ExchangeDelete(name, false, false); ch.Close() })
	return name
}
