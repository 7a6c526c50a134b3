package relay

import (
	"context"
	"errors"

	"github.com/acemq/outbox"
)

// errNotSent is the outcome, in ordered mode, of a message that was not
// published because an earlier message of its key in the batch was not.
var errNotSent = errors.New("relay: not sent: an earlier message of its key in the batch was not confirmed")

// publish hands msgs to the publisher. In ordered mode (a batch claimed
// from an ordered table) it publishes in rounds: the first message of every
// key and every message without a key, then, once the broker confirmed
// them, the second message of each key whose first was confirmed, and so
// on. A message of a key is thus sent only after the broker confirmed the
// one before it, so the queue holds them in order whichever channel or
// connection carries them; keys proceed side by side. A key whose message
// was not confirmed has its later messages not sent (errNotSent); a
// broker fault, a closed publisher or the end of ctx ends the rounds, and
// the messages never sent are not sent either (errNotSent). "Not sent"
// is the relay's word; the store's "held" is another thing (see the
// outbox package doc's Words).
//
// report, when not nil and the publisher is a ConfirmingPublisher, is told
// of confirmed messages (indices into msgs) as their confirms arrive.
func (r *Relay) publish(ctx context.Context, ordered bool, msgs []outbox.Message, report func([]int)) []error {
	if !ordered {
		return r.publishTo(ctx, msgs, report)
	}
	var (
		rounds [][]int // indices into msgs, by place in their key
		place  = make(map[string]int)
	)
	for i := range msgs { // msgs come in the order of seq
		j := 0
		if k := msgs[i].Key; k != "" {
			j = place[k]
			place[k]++
		}
		if j == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[j] = append(rounds[j], i)
	}
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = errNotSent
	}
	stopped := make(map[string]bool) // keys with a message not confirmed
	var gathered []int               // confirmed, not reported yet
	for _, round := range rounds {
		batch := make([]outbox.Message, 0, len(round))
		idx := make([]int, 0, len(round))
		for _, i := range round {
			if k := msgs[i].Key; k == "" || !stopped[k] {
				batch = append(batch, msgs[i])
				idx = append(idx, i)
			}
		}
		if len(batch) == 0 {
			break
		}
		var roundReport func([]int)
		if report != nil {
			// A round is often one message a key: gather the confirms of
			// several rounds before they are marked, or a hot key would
			// cost a statement per message.
			roundReport = func(ix []int) {
				for _, n := range ix {
					gathered = append(gathered, idx[n])
				}
				if len(gathered) >= reportEvery {
					report(gathered)
					gathered = nil
				}
			}
		}
		res := r.publishTo(ctx, batch, roundReport)
		if len(res) != len(batch) {
			return res // runOnce releases the whole batch
		}
		end := false
		for n, err := range res {
			i := idx[n]
			errs[i] = err
			if err != nil {
				stopped[msgs[i].Key] = true
				end = end || errors.Is(err, ErrBrokerUnavailable) || errors.Is(err, ErrPublisherClosed)
			}
		}
		if end || ctx.Err() != nil {
			// A broker fault, a closed publisher, PublishTimeout or
			// shutdown: the messages of the rounds left were never sent,
			// and are released as not sent.
			break
		}
	}
	return errs
}

// publishTo hands msgs to the publisher, reporting confirms as they come
// when it can and report is not nil.
func (r *Relay) publishTo(ctx context.Context, msgs []outbox.Message, report func([]int)) []error {
	if cp, ok := r.pub.(ConfirmingPublisher); ok && report != nil {
		return cp.PublishConfirming(ctx, msgs, report)
	}
	return r.pub.Publish(ctx, msgs)
}
