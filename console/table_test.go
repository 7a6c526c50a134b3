package console_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/console"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/mysqltest"
	"github.com/acemq/outbox/internal/syncbuf"
)

// Issue 44: a table's page shows what the relays hold under their leases,
// the keys a parked message blocks (with what is held behind them), and
// the published messages of the last hour as a chart; a key's page lists
// its queue in order, each message with its state. On PostgreSQL (the log
// layout) and on MariaDB.
func TestConsoleShowsClaimsBlockedKeysAndAKeysQueue(t *testing.T) {
	for _, database := range []string{"postgres", "mysql"} {
		t.Run(database, func(t *testing.T) {
			ctx := context.Background()
			cfg := &outbox.StoreConfig{MaxAttempts: 1, Ordering: outbox.OrderedByKey}
			var db *sql.DB
			if database == "mysql" {
				db = mysqltest.DB(t)
			} else {
				db, cfg.Table = dbtest.DB(t), dbtest.Table(t)
			}
			s, err := outbox.NewStore(db, cfg)
			require.NoError(t, err)
			require.NoError(t, s.CreateSchemaIfAbsent(ctx))
			add(t, db, s, outbox.Event{Type: "order.placed", Key: "o-<1>"})
			head, err := s.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, head, 1)
			require.NoError(t, s.MarkFailed(ctx, head[0], "no route"))
			add(t, db, s, outbox.Event{Type: "order.paid", Key: "o-<1>"}, outbox.Event{Type: "order.shipped", Key: "o-<1>"},
				outbox.Event{Type: "order.placed", Key: "o-2"}, outbox.Event{Type: "order.placed", Key: "o-3"})
			_, _, err = s.Reconcile(ctx)
			require.NoError(t, err)
			claimed, err := s.Claim(ctx, 10, time.Minute)
			require.NoError(t, err)
			require.Len(t, claimed, 2, "o-2 and o-3; o-<1> is blocked")
			for _, m := range claimed {
				if m.Key == "o-3" {
					require.NoError(t, s.MarkPublished(ctx, m))
				}
			}

			h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}})
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			defer srv.Close()
			c := srv.Client()

			code, body := get(t, c, srv.URL+"/table?table="+url.QueryEscape(s.Table()))
			require.Equal(t, http.StatusOK, code, body)
			require.Equal(t, 1, strings.Count(body, `class="lease"`), "o-2's claim: %s", body)
			require.Regexp(t, `class="lease"><td class="id">[^<]+</td><td class="n">1<`, body)
			require.Equal(t, 1, strings.Count(body, `class="blocked"`))
			require.Contains(t, body, `data-key="o-&lt;1&gt;"`, "keys are escaped")
			require.Regexp(t, `class="blocked"[^>]*><td><a [^>]*>o-&lt;1&gt;</a></td><td class="n">1</td><td class="n">2<`, body,
				"one parked, two held behind it")
			require.Equal(t, console.ChartMinutes, strings.Count(body, `class="bar"`))
			require.Regexp(t, `id="last">0\.0<`, body, "one published in the last minute is 1/60 a second")
			require.Regexp(t, `<title>1–0 min ago: 0\.0/s \(1 messages\)</title>`, body)

			code, body = get(t, c, srv.URL+"/key?table="+url.QueryEscape(s.Table())+"&key="+url.QueryEscape("o-<1>"))
			require.Equal(t, http.StatusOK, code, body)
			states := regexp.MustCompile(`data-state="([^"]+)"`).FindAllStringSubmatch(body, -1)
			require.Len(t, states, 3, body)
			require.Equal(t, []string{"parked", "held", "held"}, []string{states[0][1], states[1][1], states[2][1]})
			require.Contains(t, body, `data-id="`+head[0].ID+`"`)
			require.Less(t, strings.Index(body, "order.paid"), strings.Index(body, "order.shipped"), "in their order")

			// The held list: the two behind the parked head, filtered by key and age.
			held := srv.URL + "/held?table=" + url.QueryEscape(s.Table())
			code, body = get(t, c, held)
			require.Equal(t, http.StatusOK, code, body)
			require.Equal(t, 2, strings.Count(body, `class="heldmsg"`))
			_, body = get(t, c, held+"&key=o-2")
			require.Zero(t, strings.Count(body, `class="heldmsg"`))
			_, body = get(t, c, held+"&key="+url.QueryEscape("o-<1>")+"&older=1h")
			require.Zero(t, strings.Count(body, `class="heldmsg"`), "none written an hour ago")

			code, _ = get(t, c, srv.URL+"/key?table="+url.QueryEscape(s.Table()))
			require.Equal(t, http.StatusBadRequest, code, "no key")
			code, _ = get(t, c, srv.URL+"/table?table=nope")
			require.Equal(t, http.StatusNotFound, code)
		})
	}
}

// Issue 44: the delayed messages are paged, filtered by type and key, and
// published now in bulk by filter, after a confirmation that counts them.
func TestConsolePagesDelayedAndPublishesThemByFilter(t *testing.T) {
	ctx := context.Background()
	db := dbtest.DB(t)
	s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t)})
	require.NoError(t, err)
	require.NoError(t, s.CreateSchemaIfAbsent(ctx))
	var evts []outbox.Event
	for i := range console.PageSize + 10 {
		key := "k1"
		if i%10 == 0 {
			key = "k2" // 6 of them
		}
		evts = append(evts, outbox.Event{Type: "remind", Key: key, NotBefore: time.Now().Add(time.Hour + time.Duration(i)*time.Second)})
	}
	add(t, db, s, evts...)
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()
	table := url.QueryEscape(s.Table())

	code, body := get(t, c, srv.URL+"/delayed?table="+table)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, console.PageSize, strings.Count(body, `class="delayed"`))
	next := regexp.MustCompile(`href="(delayed\?[^"]+)" id="next"`).FindStringSubmatch(body)
	require.NotNil(t, next, "a next page")
	code, body = get(t, c, srv.URL+"/"+strings.ReplaceAll(next[1], "&amp;", "&"))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 10, strings.Count(body, `class="delayed"`), "the rest")
	require.NotContains(t, body, `id="next"`)

	_, body = get(t, c, srv.URL+"/delayed?table="+table+"&due_in=2h")
	require.Zero(t, strings.Count(body, `class="delayed"`), "none is due two hours from now or later")
	_, body = get(t, c, srv.URL+"/delayed?table="+table+"&due_in=30m")
	require.Equal(t, console.PageSize, strings.Count(body, `class="delayed"`), "all are due later than half an hour from now")

	code, body = get(t, c, srv.URL+"/delayed?table="+table+"&key=k2")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 6, strings.Count(body, `class="delayed"`))

	code, body = get(t, c, srv.URL+"/confirm?action=publish-now&scope=filter&table="+table+"&key=k2")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "publish-now 6 messages")
	require.Contains(t, body, "Every delayed message whose key is <code>k2</code>")
	token := csrfField.FindStringSubmatch(body)
	require.NotNil(t, token)
	resp, err := c.PostForm(srv.URL+"/act", url.Values{"csrf": {token[1]}, "action": {"publish-now"}, "scope": {"filter"},
		"table": {s.Table()}, "key": {"k2"}})
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), "publish-now: 6 of 6 messages")
	_, err = s.MoveDue(ctx)
	require.NoError(t, err)
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, st.Ready, "the six of k2 are due and moved into the table")
	require.EqualValues(t, console.PageSize+4, st.Scheduled, "the others still wait")
}

// Issue 44: the parked list is filtered by age (parked at least so long
// ago), and an action by filter keeps to it.
func TestConsoleFiltersParkedByAge(t *testing.T) {
	ctx := context.Background()
	db, s, msgs := parkedTable(t, []string{"no route"}, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}, outbox.Event{Type: "c"})
	_, err := db.ExecContext(ctx, `UPDATE "`+s.Table()+`_failed" SET parked_at = now() - interval '3 hours' WHERE id = $1`, msgs[1].ID)
	require.NoError(t, err)
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()
	list := srv.URL + "/parked?table=" + url.QueryEscape(s.Table())

	code, body := get(t, c, list+"&older=2h")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 1, strings.Count(body, `class="msg"`))
	require.Contains(t, body, `data-id="`+msgs[1].ID+`"`)
	code, body = get(t, c, list+"&older=1d")
	require.Equal(t, http.StatusOK, code)
	require.Zero(t, strings.Count(body, `class="msg"`))
	code, body = get(t, c, list+"&older=soon")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "not one")

	code, body = get(t, c, srv.URL+"/confirm?action=retry&scope=filter&table="+url.QueryEscape(s.Table())+"&older=2h")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "retry 1 message of")
	require.Contains(t, body, "parked at least <code>2h</code> ago")
	token := csrfField.FindStringSubmatch(body)
	require.NotNil(t, token)
	resp, err := c.PostForm(srv.URL+"/act", url.Values{"csrf": {token[1]}, "action": {"retry"}, "scope": {"filter"},
		"table": {s.Table()}, "older": {"2h"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Parked, "only the one parked three hours ago was retried")
}

// Issue 44: an inbox's page shows what waits in its dead-letter queue, and
// replays it after a confirmation that counts it: each message back in the
// queue it was dead-lettered from.
func TestConsoleReplaysADeadLetterQueue(t *testing.T) {
	ctx := context.Background()
	db := dbtest.DB(t)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: dbtest.Table(t)})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	conn := amqptest.Conn(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	queue, dlq := amqptest.Name(t, "q"), amqptest.Name(t, "dlq")
	_, err = ch.QueueDeclare(dlq, false, true, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, false, true, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	require.NoError(t, err)
	for _, id := range []string{"m-1", "m-2"} {
		require.NoError(t, ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`)}))
		var d amqp.Delivery
		require.Eventually(t, func() bool {
			var ok bool
			d, ok, err = ch.Get(queue, false)
			require.NoError(t, err)
			return ok
		}, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, d.Nack(false, false)) // dead-lettered, with x-death naming queue
	}
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(dlq, false, true, false, false, nil)
		require.NoError(t, err)
		return q.Messages == 2
	}, 10*time.Second, 10*time.Millisecond)

	name := "billing@" + ib.Table()
	_, s, _ := parkedTable(t, []string{"no"}, outbox.Event{Type: "a"})
	var audit syncbuf.Buffer
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}, Inboxes: []*inbox.Inbox{ib},
		DeadLetterQueues: map[string]string{name: dlq}, Logger: slog.New(slog.NewTextHandler(&audit, nil)),
		Broker: func(context.Context) (*amqp.Connection, error) { return amqp.Dial(amqptest.URL()) }})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()

	code, body := get(t, c, srv.URL+"/inbox?inbox="+url.QueryEscape(name))
	require.Equal(t, http.StatusOK, code, body)
	require.Regexp(t, `id="dead-queue">Dead-letter queue <code>`+dlq+`</code>: <b>2</b> messages waiting`, body)
	code, body = get(t, c, srv.URL+"/confirm?action=inbox-replay&inbox="+url.QueryEscape(name))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "inbox-replay 2 messages of "+dlq)
	token := csrfField.FindStringSubmatch(body)
	require.NotNil(t, token)
	q, err := ch.QueueDeclarePassive(queue, false, true, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "asking moves nothing")

	resp, err := c.PostForm(srv.URL+"/act", url.Values{"action": {"inbox-replay"}, "inbox": {name}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "without the token")
	resp, err = c.PostForm(srv.URL+"/act", url.Values{"action": {"inbox-replay"}, "inbox": {name}, "csrf": {token[1]}})
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), "inbox-replay: 2 messages moved from "+dlq)
	q, err = ch.QueueDeclarePassive(queue, false, true, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 2, q.Messages, "back in the queue they were dead-lettered from")
	require.Contains(t, audit.String(), "console: inbox-replay")

	_, err = console.Handler(console.Config{Stores: []*outbox.Store{s}, Inboxes: []*inbox.Inbox{ib}, DeadLetterQueues: map[string]string{name: dlq}})
	require.ErrorContains(t, err, "needs Config.Broker")
	_, err = console.Handler(console.Config{Stores: []*outbox.Store{s}, DeadLetterQueues: map[string]string{"x@y": dlq},
		Broker: func(context.Context) (*amqp.Connection, error) { return nil, nil }})
	require.ErrorContains(t, err, "not among Config.Inboxes")
}
