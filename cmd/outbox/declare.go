package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox/internal/amqpdial"
	"github.com/acemq/outbox/internal/redact"
	"github.com/acemq/outbox/relay"
	"github.com/acemq/outbox/topology"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func cmdDeclare(ctx context.Context, x *cli, args []string) error {
	c := newBrokerCommon("declare", x) // the broker only: no --database-url
	file := c.fs.String("file", "", "a topology file (JSON: exchanges, queues with bindings; see package topology), instead of or beside the flags below")
	exchange := c.fs.String("exchange", "", "an exchange to declare (durable)")
	kind := c.fs.String("kind", "topic", "the exchange's kind: topic, direct, fanout or headers")
	alternate := c.fs.String("alternate-exchange", "", "with --exchange: let the broker route what no queue is bound for to this exchange (declared as a fanout)")
	queue := c.fs.String("queue", "", "a queue to declare (quorum, durable), with a dead-letter queue QUEUE.dead")
	var binds repeated
	c.fs.Var(&binds, "bind", "with --queue and --exchange: a binding `key`, e.g. 'order.#' (repeat for more)")
	classic := c.fs.Bool("classic", false, "with --queue: a classic queue instead of a quorum queue")
	noDead := c.fs.Bool("no-dead-letter", false, "with --queue: no dead-letter queue (the broker then drops what consumers dead-letter)")
	dryRun := c.fs.Bool("dry-run", false, "print what would be declared, and declare nothing")
	amqpURL := c.fs.String("amqp-url", "", amqpURLHelp)
	if err := c.parse(args); err != nil {
		return err
	}
	t := &topology.Topology{}
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		parsed, err := topology.Parse(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		t = parsed
	}
	if *exchange != "" {
		t.Exchanges = append(t.Exchanges, topology.Exchange{Name: *exchange, Kind: *kind, AlternateExchange: *alternate})
	} else if *alternate != "" {
		return c.usageError("--alternate-exchange goes with --exchange")
	}
	if *queue != "" {
		q := topology.Queue{Name: *queue, Classic: *classic, NoDeadLetter: *noDead}
		if len(binds) > 0 && *exchange == "" {
			return c.usageError("--bind binds --queue to --exchange: give --exchange too")
		}
		for _, k := range binds {
			q.Bindings = append(q.Bindings, topology.Binding{Exchange: *exchange, Key: k})
		}
		t.Queues = append(t.Queues, q)
	} else if len(binds) > 0 || *classic || *noDead {
		return c.usageError("--bind, --classic and --no-dead-letter go with --queue")
	}
	if len(t.Exchanges) == 0 && len(t.Queues) == 0 {
		return c.usageError("nothing to declare: give --file, --exchange or --queue, e.g. --exchange shop --queue billing --bind 'order.#'")
	}
	steps, err := t.Plan()
	if err != nil {
		return err
	}
	if *dryRun {
		for _, s := range steps {
			fmt.Fprintln(c.stdout, "would declare", s.Desc)
		}
		fmt.Fprintln(c.stdout, "dry run: nothing declared")
		return nil
	}
	conn, err := dialAny(ctx, c, *amqpURL, "acemq-outbox-declare")
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := t.Declare(ctx, conn); err != nil {
		return err
	}
	for _, s := range steps {
		fmt.Fprintln(c.stdout, "declared", s.Desc)
	}
	return nil
}

// amqpDialer returns the dialer of the broker URLs of --amqp-url, else of
// AMQP_URL, else relay.AMQPURLDefault, and the URLs. A URL that does not
// parse is refused here, shown with its password redacted, before the
// command creates anything.
func (c *common) amqpDialer(flagValue, name string) (*amqpdial.Dialer, []string, error) {
	urls := c.amqpURLs(flagValue)
	if len(urls) == 0 {
		urls = []string{relay.AMQPURLDefault}
	}
	for i, u := range urls {
		if _, err := amqp.ParseURI(u); err != nil {
			// amqp091-go's message quotes the URL, or the start of a
			// password cut at a '/', '#' or '?' (or split at a ','):
			// only the kind of problem is said.
			return nil, nil, fmt.Errorf("AMQP URL #%d of %d is %s: %s", i+1, len(urls), redact.Malformed(u), redact.Reason(err))
		}
	}
	d, err := amqpdial.New("outbox "+c.name, "--amqp-url", amqpdial.Config{URLs: urls, Name: name})
	return d, urls, err
}

// dialFirst connects to the first node of d, for a command that works on
// one broker: the error names the node with its password redacted.
func (c *common) dialFirst(ctx context.Context, d *amqpdial.Dialer, url string) (*amqp.Connection, error) {
	conn, err := d.Dial(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %s", redactDSN(url), c.secrets.scrub(d.Redact(err.Error())))
	}
	return conn, nil
}

// dialAny connects to the first node of --amqp-url (or AMQP_URL) that
// answers.
func dialAny(ctx context.Context, c *common, flagValue, name string) (*amqp.Connection, error) {
	dialer, _, err := c.amqpDialer(flagValue, name)
	if err != nil {
		return nil, err
	}
	var errs []string
	for i := range dialer.Nodes() {
		conn, err := dialer.Dial(ctx, i)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, dialer.Display(i)+": "+err.Error())
	}
	return nil, fmt.Errorf("cannot reach RabbitMQ: %s", strings.Join(errs, "; "))
}
