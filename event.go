package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ContentTypeDefault is the content type of an Event that does not set one.
const ContentTypeDefault = "application/json"

// Event is a domain event as application code records it. It becomes one
// outbox row, and later one AMQP message, when the transaction that recorded
// it commits.
type Event struct {
	// ID, when set, is the message's id (its AMQP message-id): a UUID, in
	// any of the forms github.com/google/uuid parses, stored in its
	// canonical form. Set it to return the id to your caller before the
	// relay runs, or to make writing the same event twice an error
	// (ErrDuplicateID) instead of a second message. Empty: Add assigns a
	// new UUIDv7. Store.AddIDs reports the ids either way.
	ID string

	// Type names what happened, such as "order.placed". It is required, and it
	// is the default routing key.
	Type string

	// Key identifies the aggregate the event is about (an order id, say). It
	// travels as the "x-event-key" header. In ordered mode
	// (StoreConfig.Ordering) the outbox keeps the order of each key's
	// messages: writers of a key take turns and relays publish a key's
	// messages one after another; unordered, it is a hint for consumers
	// that partition by aggregate. At most KeyMaxBytes.
	Key string

	// Payload is the message body, sent as is.
	Payload []byte

	// ContentType describes Payload. Defaults to "application/json".
	ContentType string

	// Headers are sent as AMQP headers. They are merged over the headers of
	// StoreConfig.Headers, so a value set here wins.
	Headers map[string]string

	// Exchange, when not empty, overrides the exchange chosen by the Router.
	Exchange string

	// RoutingKey, when not empty, overrides the routing key chosen by the Router.
	RoutingKey string

	// NotBefore, when later than now, delays the message: the relay
	// publishes it no earlier than NotBefore and, once it is due, within
	// its usual latency (a relay moves due messages into the table every
	// 100ms; see Store.Maintain). The zero time, or a time that has
	// passed, means now. At most NotBeforeMax ahead: later is an
	// ErrInvalidEvent, never a silent clamp.
	//
	// The delay is what NotBefore is ahead of the writer's clock when Add
	// runs, and it runs on the database's clock from the INSERT on, as
	// created_at does: a writer whose clock is off by a minute still gets
	// the delay it asked for. Until it is due, a delayed message waits
	// beside the table, in <table>_scheduled (Stats.Scheduled, outbox
	// status); a transaction that rolls back takes it back with the rest.
	// It commits with the transaction like any other event.
	//
	// On an ordered table a delayed message takes its place in its key's
	// order when it is due, as if it were written then: it goes out after
	// the messages of its key committed before that, before those written
	// later, and it holds nothing back while it waits.
	NotBefore time.Time
}

// JSON returns an Event of the given type and key whose payload is v encoded
// as JSON.
func JSON(typ, key string, v any) (Event, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return Event{}, fmt.Errorf("outbox: encoding %q event payload as JSON: %w", typ, err)
	}
	return Event{Type: typ, Key: key, Payload: payload, ContentType: ContentTypeDefault}, nil
}

// Source is implemented by anything that hands over the events it has
// recorded. PullEvents returns the events and forgets them, so that each is
// written once. Models that embed a Recorder implement Source.
type Source interface {
	PullEvents() []Event
}

// Recorder collects the events of an aggregate until the ORM writes them.
// Embed it in a model: it adds no column and no JSON field, and the GORM
// plugin and ent hook pull its events when they write the model in a
// transaction.
//
// Its zero value is ready to use. Like the model it is embedded in, a
// Recorder is not safe for concurrent use; it holds no lock, so that models
// with value-receiver methods (TableName, say) stay free of go vet's
// copylocks warning.
type Recorder struct {
	events []Event
}

// Record adds events to be written with the aggregate's next write.
func (r *Recorder) Record(evts ...Event) {
	r.events = append(r.events, evts...)
}

// PullEvents returns the recorded events and clears them.
func (r *Recorder) PullEvents() []Event {
	evts := r.events
	r.events = nil
	return evts
}

// PendingEvents returns a copy of the recorded events without clearing them.
func (r *Recorder) PendingEvents() []Event {
	return append([]Event(nil), r.events...)
}

var _ Source = (*Recorder)(nil)

// Router decides where an event is published: the exchange and the routing
// key. It is called when the event is written, and its answer is stored in
// the outbox row. Event.Exchange and Event.RoutingKey, when set, override it.
type Router func(Event) (exchange, routingKey string)

// ToExchange returns a Router that publishes every event to the named
// exchange with the event type as routing key. ToExchange("") routes through
// the broker's default exchange, which delivers to the queue named like the
// event type.
func ToExchange(name string) Router {
	return func(e Event) (string, string) { return name, e.Type }
}

// HeaderFunc returns headers to add to every event written with the given
// context, for example the W3C trace context of the writer's span. Headers an
// Event sets itself win over those returned here.
type HeaderFunc func(context.Context) map[string]string
