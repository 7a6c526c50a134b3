package relay

import "context"

// Probe exposes AMQPPublisher.probe to the package's external tests.
func Probe(ctx context.Context, p *AMQPPublisher) error { return p.probe(ctx) }

// UnconfirmedMax exposes unconfirmedMax.
var UnconfirmedMax = unconfirmedMax
