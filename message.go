package outbox

import (
	"time"
)

// Message is one outbox row as the relay sees it: an Event after it was
// written, with its id and its delivery state.
type Message struct {
	// ID is the message's UUIDv7, assigned when the event is written. It is
	// sent as the AMQP message-id and stays the same on every redelivery:
	// consumers deduplicate on it.
	ID string

	// EventType, Key, Exchange, RoutingKey, Payload, ContentType and Headers
	// are those of the written Event, with the Router's choice of exchange
	// and routing key and the HeaderFunc's headers applied.
	EventType   string
	Key         string
	Exchange    string
	RoutingKey  string
	Payload     []byte
	ContentType string
	Headers     map[string]string

	// Seq is the message's place in the order the database gave the
	// messages as they were written (a sequence); claims return messages
	// in this order, and ordered mode (StoreConfig.Ordering) keeps it per
	// key.
	Seq int64

	// CreatedAt is when the writing transaction started, by the database clock.
	CreatedAt time.Time

	// Attempts counts failed publish attempts so far.
	Attempts int

	// LastError is the reason given by the last failed attempt, if any.
	LastError string

	// ClaimedUntil is when the claim that returned this message expires, by
	// the database clock. Zero for messages that are not claimed.
	ClaimedUntil time.Time

	// ParkedAt is when the message was parked; zero unless it is parked.
	ParkedAt time.Time

	// NotBefore is when a delayed message listed by Store.Scheduled is
	// due, by the database's clock; zero for every other message.
	NotBefore time.Time

	// claim fences the claim that returned the message: marks apply only
	// while the row (or the batch) still carries it. Nil for a message
	// that was not claimed.
	claim claimRef

	// unfit says why the row cannot be relayed as written (headers that
	// do not decode, a header Add refuses), as a claim found it: the claim
	// parks it instead of returning it (see Store.Claim).
	unfit string
}

// claimRef is what a claim gave a message, typed by the layout that made
// it: a mark or release of a message claimed from another layout (the
// table was converted meanwhile) finds its lease lost.
type claimRef interface{ claimRef() }
