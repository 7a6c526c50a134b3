package relay

import (
	"context"
	"time"

	"github.com/acemq/outbox"
)

// Observer sees what a relay does, for metrics and alerts. The relay calls
// it from its stages, concurrently, in the middle of their work: its methods
// must be quick, must not block and must be safe for concurrent use. Embed
// NopObserver to implement only some of them. Package relay imports no
// metrics library; an OpenTelemetry implementation plugs in here.
type Observer interface {
	// Claimed follows every claim: how many messages it took (0 when none
	// was ready), how long it took, and its error.
	Claimed(ctx context.Context, n int, took time.Duration, err error)

	// Published follows a batch's publish: how long publishing took,
	// confirms included, and how many messages the broker confirmed.
	Published(ctx context.Context, n int, took time.Duration)

	// Lag reports, for every message the broker confirmed, the time from
	// its CreatedAt (when the writing transaction started, by the
	// database's clock) to the confirm (by the relay's clock): what
	// operators call the outbox's lag. Clock skew between the two hosts
	// shifts it.
	Lag(ctx context.Context, msg *outbox.Message, lag time.Duration)

	// Failed reports a message that failed by its own fault, an attempt
	// counted: class is one of the Class constants (ClassOther for errors
	// of other Publishers), parked whether this attempt parked it.
	Failed(ctx context.Context, msg *outbox.Message, class string, parked bool)

	// Released reports n messages given back without an attempt: reason
	// is "broker" (a broker fault), "shutdown", or "order" (ordered mode:
	// not sent because an earlier message of its key in the batch was
	// not published).
	Released(ctx context.Context, n int, reason string)

	// LeasesLost reports n messages whose claim had passed to another
	// relay when they were settled.
	LeasesLost(ctx context.Context, n int)

	// Settled follows the marks and releases of a batch: how long they
	// took and, if one failed (a lost lease aside), its error.
	Settled(ctx context.Context, took time.Duration, err error)
}

// Reasons of Observer.Released.
const (
	ReleasedBroker   = "broker"
	ReleasedShutdown = "shutdown"
	ReleasedOrder    = "order"
)

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

func (NopObserver) Claimed(context.Context, int, time.Duration, error)    {}
func (NopObserver) Published(context.Context, int, time.Duration)         {}
func (NopObserver) Lag(context.Context, *outbox.Message, time.Duration)   {}
func (NopObserver) Failed(context.Context, *outbox.Message, string, bool) {}
func (NopObserver) Released(context.Context, int, string)                 {}
func (NopObserver) LeasesLost(context.Context, int)                       {}
func (NopObserver) Settled(context.Context, time.Duration, error)         {}

var _ Observer = NopObserver{}
