package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/acemq/outbox/inbox"
)

// deadQueue is what an inbox's page says of its dead-letter queue.
type deadQueue struct {
	Name     string
	Messages int // waiting in it, as the broker counts them
	Err      string
}

// lookDeadQueue reads how many messages wait in the dead-letter queue of
// the inbox name, nil when none is configured.
func (c *console) lookDeadQueue(ctx context.Context, name string) *deadQueue {
	q := c.cfg.DeadLetterQueues[name]
	if q == "" {
		return nil
	}
	dq := &deadQueue{Name: q}
	n, err := c.queueDepth(ctx, q)
	if err != nil {
		dq.Err = err.Error()
	}
	dq.Messages = n
	return dq
}

// queueDepth asks the broker how many messages wait in queue q.
func (c *console) queueDepth(ctx context.Context, q string) (int, error) {
	conn, err := c.cfg.Broker(ctx)
	if err != nil {
		return 0, fmt.Errorf("reaching the broker: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("reaching the broker: %w", err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", q, err)
	}
	return st.Messages, nil
}

// deadQueueOf is the dead-letter queue of a's inbox; without one, it
// says so to the requester.
func (c *console) deadQueueOf(w http.ResponseWriter, r *http.Request, a action) (string, bool) {
	q := c.cfg.DeadLetterQueues[a.Inbox]
	if q == "" {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no dead-letter queue is configured for inbox %q", a.Inbox))
	}
	return q, q != ""
}

// confirmReplay asks before replaying an inbox's dead-letter queue.
func (c *console) confirmReplay(w http.ResponseWriter, r *http.Request, a action) {
	q, ok := c.deadQueueOf(w, r, a)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	n, err := c.queueDepth(ctx, q)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, err.Error())
		return
	}
	c.render(w, r, "confirm.html", map[string]any{"Action": a, "Count": min(n, BulkMax), "Capped": n > BulkMax, "Queue": q,
		"Back": "inbox?inbox=" + url.QueryEscape(a.Inbox), "Of": q})
}

// replay moves the messages of an inbox's dead-letter queue back to the
// queues they were dead-lettered from, at most BulkMax.
func (c *console) replay(w http.ResponseWriter, r *http.Request, a action) {
	q, ok := c.deadQueueOf(w, r, a)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	conn, err := c.cfg.Broker(ctx)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, fmt.Sprintf("reaching the broker: %v", err))
		return
	}
	defer conn.Close()
	n, err := inbox.Replay(ctx, conn, q, "", BulkMax)
	c.log.Info("console: inbox-replay", "inbox", a.Inbox, "queue", q, "by", who(r), "moved", n, "err", err)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%d moved, then: %v", n, err))
		return
	}
	v := url.Values{"inbox": {a.Inbox}, "done": {fmt.Sprintf("inbox-replay: %d messages moved from %s", n, q)}}
	http.Redirect(w, r, "inbox?"+v.Encode(), http.StatusSeeOther)
}
