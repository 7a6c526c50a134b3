package relay

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
)

var maxSizeRe = regexp.MustCompile(`larger than configured max size (\d+)`)

// blame decides, from the reason the broker gave for closing the channel,
// whether an unconfirmed message caused it. A missing exchange or an
// oversized body is pinned on the message the reason names. A reason that
// says the client sent something the broker refused, without saying which
// message, makes every unconfirmed message a suspect (see
// publishIsolating). Anything else is the broker's fault.
func (p *amqpLane) blame(m *outbox.Message, closeErr *amqp.Error) error {
	if closeErr == nil {
		return brokerFault(m.ID, ClassConnection, "the connection was lost or timed out before the broker confirmed", nil)
	}
	switch closeErr.Code {
	case amqp.NotFound:
		if strings.Contains(closeErr.Reason, fmt.Sprintf("no exchange '%s'", m.Exchange)) {
			return messageFault(m.ID, ClassMissingExchange, fmt.Sprintf("exchange %q does not exist (broker replied %d %s); declare it and bind a queue to it (outbox declare --exchange %s --queue NAME --bind KEY), or change the Router", m.Exchange, closeErr.Code, closeErr.Reason, m.Exchange))
		}
	case amqp.PreconditionFailed:
		if sm := maxSizeRe.FindStringSubmatch(closeErr.Reason); sm != nil {
			limit, _ := strconv.ParseInt(sm[1], 10, 64)
			if limit > 0 && limit < p.maxMessageSize.Load() {
				p.maxMessageSize.Store(limit)
			}
			if int64(len(m.Payload)) > limit {
				return messageFault(m.ID, ClassOversized, fmt.Sprintf("message body is %d bytes, larger than the broker's max_message_size of %d bytes; store large payloads elsewhere and send a reference", len(m.Payload), limit))
			}
		}
	}
	pe := brokerFault(m.ID, ClassConnection, "the broker closed the channel before confirming", closeErr)
	pe.suspect = closeErr.Server && clientCaused(closeErr.Code)
	return pe
}

// clientCaused reports whether an AMQP close code says the broker refused
// something the client sent, rather than that it is shutting down, was told
// to close the connection or failed itself. Publishing sends nothing but
// messages, so one of them is the cause.
func clientCaused(code int) bool {
	switch code {
	case amqp.ContentTooLarge, amqp.AccessRefused, amqp.NotFound, amqp.PreconditionFailed,
		amqp.FrameError, amqp.SyntaxError, amqp.CommandInvalid, amqp.UnexpectedFrame, amqp.NotImplemented:
		return true
	}
	return false
}

// encodingError reports whether a publish error is amqp091-go refusing the
// message's content rather than a failing connection.
func encodingError(err error) bool {
	return errors.Is(err, amqp.ErrFieldType) || strings.Contains(err.Error(), "exceeds 255 bytes")
}

// unencodable says why AMQP 0-9-1 cannot carry m, or returns "": short
// strings (names, keys, properties, header names) hold at most 255 bytes.
// Store.Add refuses such events; this guards rows written otherwise.
func unencodable(m *outbox.Message) string {
	for _, f := range []struct{ what, v string }{
		{"exchange", m.Exchange}, {"routing key", m.RoutingKey}, {"content type", m.ContentType},
		{"event type", m.EventType}, {"message id", m.ID},
	} {
		if len(f.v) > 255 {
			return fmt.Sprintf("the %s is %d bytes; AMQP allows at most 255", f.what, len(f.v))
		}
	}
	for k := range m.Headers {
		if len(k) > 255 {
			return fmt.Sprintf("header name %.40q… is %d bytes; AMQP allows at most 255", k, len(k))
		}
	}
	return ""
}

// Publishing is the AMQP message AMQPPublisher sends for m, with every
// property it sets: persistent, the outbox id as message-id, the event type
// as type, the time written as timestamp, the headers with the key in
// KeyHeader. Package outboxtest records it for tests.
func Publishing(m *outbox.Message) amqp.Publishing {
	var headers amqp.Table
	if len(m.Headers) > 0 || m.Key != "" {
		headers = make(amqp.Table, len(m.Headers)+1)
		for k, v := range m.Headers {
			headers[k] = v
		}
		if m.Key != "" {
			headers[KeyHeader] = m.Key
		}
	}
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    m.CreatedAt,
		Type:         m.EventType,
		Body:         m.Payload,
	}
}
