package relay

import (
	"errors"
	"fmt"
)

// ErrBrokerUnavailable marks a publish failure that is the broker's fault
// rather than the message's: no connection, a connection or channel lost
// before the confirm arrived, a confirm that did not arrive in time. Such
// messages are released without counting an attempt, and the relay backs
// off before it tries again.
//
// Every other error a Publisher returns for a message counts as the
// message's fault: the relay marks it failed, which counts an attempt and
// eventually parks it.
var ErrBrokerUnavailable = errors.New("relay: broker unavailable")

// ErrPublisherClosed is reported for every message given to an
// AMQPPublisher after its Close. Run returns it: a relay cannot go on
// without its publisher.
var ErrPublisherClosed = errors.New("relay: publisher is closed")

// PublishError is the error AMQPPublisher returns for a message it could not
// publish.
type PublishError struct {
	// ID is the message's id.
	ID string
	// Reason says what went wrong, for logs and the outbox table's
	// last_error column.
	Reason string
	// BrokerFault is true when the broker, not the message, is to blame (see
	// ErrBrokerUnavailable).
	BrokerFault bool
	// Err is the underlying error, if any.
	Err error

	// Class names the kind of failure for metrics and alerts, one of the
	// Class constants.
	Class string

	// suspect marks a broker fault that a message of the batch may have
	// caused: the broker closed the channel refusing something the client
	// sent, without saying what.
	suspect bool
}

func (e *PublishError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("relay: message %s not published: %s: %v", e.ID, e.Reason, e.Err)
	}
	return fmt.Sprintf("relay: message %s not published: %s", e.ID, e.Reason)
}

func (e *PublishError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrBrokerUnavailable) true for broker faults.
func (e *PublishError) Is(target error) bool {
	return target == ErrBrokerUnavailable && e.BrokerFault
}

// The classes of PublishError, as metric labels. The first five are the
// message's fault (an attempt is counted), the others the broker's.
const (
	ClassUnroutable      = "unroutable"       // no queue bound for the routing key
	ClassMissingExchange = "missing_exchange" // the exchange does not exist
	ClassOversized       = "oversized"        // the body is over the broker's limit
	ClassUnencodable     = "unencodable"      // AMQP cannot carry the message as it is
	ClassRefused         = "refused"          // the broker closed the channel over this message alone
	ClassNack            = "nack"             // the broker could not take it now
	ClassConnection      = "connection"       // no connection, or it was lost
	ClassTimeout         = "timeout"          // no confirm in time
	ClassBlocked         = "blocked"          // the broker blocked publishing (an alarm)
	ClassClosed          = "closed"           // the publisher was closed
	ClassOther           = "other"            // an error of another Publisher
)

func brokerFault(id, class, reason string, err error) *PublishError {
	return &PublishError{ID: id, Class: class, Reason: reason, BrokerFault: true, Err: err}
}

func messageFault(id, class, reason string) *PublishError {
	return &PublishError{ID: id, Class: class, Reason: reason}
}
