package console_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
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
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/syncbuf"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// parkedTable makes a table of the log layout with the given events, all
// of them parked with the given reasons (one each), and one more ready.
func parkedTable(t *testing.T, reasons []string, evts ...outbox.Event) (*sql.DB, *outbox.Store, []outbox.Message) {
	t.Helper()
	ctx := context.Background()
	db := dbtest.DB(t)
	s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t), MaxAttempts: 1})
	require.NoError(t, err)
	require.NoError(t, s.CreateSchemaIfAbsent(ctx))
	add(t, db, s, evts...)
	msgs, err := s.Claim(ctx, len(evts), time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, len(evts))
	for i, m := range msgs {
		require.NoError(t, s.MarkFailed(ctx, m, reasons[i%len(reasons)]))
	}
	add(t, db, s, outbox.Event{Type: "ready"})
	return db, s, msgs
}

func add(t *testing.T, db *sql.DB, s *outbox.Store, evts ...outbox.Event) {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, s.Add(context.Background(), tx, evts...))
	require.NoError(t, tx.Commit())
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// The console's pages show what the table holds, escaped; a retry asks
// first and does it only on a POST with the page's CSRF token, from the
// same origin, and writes an audit line; a POST without the token (or
// with another's) changes nothing.
func TestConsoleRetriesOnlyWithItsToken(t *testing.T) {
	ctx := context.Background()
	_, s, msgs := parkedTable(t, []string{"NOT_FOUND - no exchange 'orders'", "<b>bold</b> reply"},
		outbox.Event{Type: "order.placed", Key: "o-1", Payload: []byte(`{"x":"<script>alert(1)</script>"}`)},
		outbox.Event{Type: "order.paid", Key: "o-2"},
		outbox.Event{Type: "order.placed", Key: "o-3"})
	var audit syncbuf.Buffer
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}, Logger: slog.New(slog.NewTextHandler(&audit, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()

	code, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-table="`+s.Table()+`"`)
	require.Regexp(t, `class="n pending">4<`, body, "three parked and one ready are pending")
	require.Regexp(t, `class="n parked"><a[^>]*>3<`, body)

	code, body = get(t, c, srv.URL+"/parked?table="+url.QueryEscape(s.Table())+"&error=no+exchange")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 2, strings.Count(body, `class="msg"`), "the messages parked by the missing exchange")
	require.NotContains(t, body, "<script>alert", "payloads are escaped")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")

	code, body = get(t, c, srv.URL+"/parked?table="+url.QueryEscape(s.Table())+"&error=bold")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<b>bold</b>", "errors are escaped")

	// The confirmation names what would change and changes nothing.
	code, body = get(t, c, srv.URL+"/confirm?action=retry&scope=filter&table="+url.QueryEscape(s.Table())+"&error=no+exchange")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "retry 2 messages")
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Parked)
	token := csrfField.FindStringSubmatch(body)
	require.NotNil(t, token, "the confirmation's form carries a CSRF token")

	form := url.Values{"action": {"retry"}, "scope": {"filter"}, "table": {s.Table()}, "error": {"no exchange"}}
	for name, tok := range map[string]string{"no token": "", "a wrong token": "x" + token[1]} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		if tok != "" {
			f.Set("csrf", tok)
		}
		resp, err := c.PostForm(srv.URL+"/act", f)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, name)
	}
	// From another origin, even with the token.
	form.Set("csrf", token[1])
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/act", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a cross-site POST")
	st, err = s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Parked, "no refused POST changed anything")

	resp, err = c.PostForm(srv.URL+"/act", form)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "after the redirect to the list")
	require.Contains(t, string(b), "retry: 2 of 2 messages")
	st, err = s.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked, "the two parked by the missing exchange were retried")
	left, err := s.FindParked(ctx, outbox.ParkedQuery{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, msgs[1].ID, left[0].ID)
	require.Contains(t, audit.String(), "console: retry")
	require.Contains(t, audit.String(), "changed=2")
}

// With credentials, every request needs them: a token as a bearer token
// or as basic authentication's password, a user and password by basic
// authentication; a read-only console refuses every action.
func TestConsoleAuthenticatesAndReadOnlyRefuses(t *testing.T) {
	_, s, _ := parkedTable(t, []string{"no"}, outbox.Event{Type: "a"})
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}, Token: "t0ken", ReadOnly: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for name, set := range map[string]func(*http.Request){
		"none":            func(*http.Request) {},
		"wrong bearer":    func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") },
		"wrong basic":     func(r *http.Request) { r.SetBasicAuth("op", "nope") },
		"right, as basic": func(r *http.Request) { r.SetBasicAuth("op", "t0ken") },
		"right, bearer":   func(r *http.Request) { r.Header.Set("Authorization", "Bearer t0ken") },
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		require.NoError(t, err)
		set(req)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.HasPrefix(name, "right") {
			require.Equal(t, http.StatusOK, resp.StatusCode, name)
			require.Contains(t, string(body), "read-only")
			require.NotContains(t, string(body), "t0ken", "the token is never rendered")
		} else {
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
			require.NotEmpty(t, resp.Header.Get("WWW-Authenticate"))
		}
	}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/parked?table="+url.QueryEscape(s.Table()), nil)
	require.NoError(t, err)
	req.SetBasicAuth("op", "t0ken")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NotContains(t, string(body), "Retry chosen", "no buttons when read-only")

	req, err = http.NewRequest(http.MethodGet, srv.URL+"/confirm?action=retry&scope=filter&table="+url.QueryEscape(s.Table()), nil)
	require.NoError(t, err)
	req.SetBasicAuth("op", "t0ken")
	resp, err = srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// Configurations that cannot work are errors.
func TestConsoleRefusesMisuse(t *testing.T) {
	_, err := console.Handler(console.Config{})
	require.ErrorContains(t, err, "Stores is empty")
	s, err := outbox.NewStore(nil, &outbox.StoreConfig{})
	require.NoError(t, err)
	_, err = console.Handler(console.Config{Stores: []*outbox.Store{s, s}})
	require.ErrorContains(t, err, "given twice")
	_, err = console.Handler(console.Config{Stores: []*outbox.Store{s}, User: "op"})
	require.ErrorContains(t, err, "go together")
	_, err = console.Handler(console.Config{Stores: []*outbox.Store{nil}})
	require.ErrorContains(t, err, "nil")
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	big := httptest.NewRequest(http.MethodPost, "/act", bytes.NewReader(bytes.Repeat([]byte("a"), 100<<10)))
	big.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(rec, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "a body past 64 KiB")
}

// An inbox's dead letters are listed, and made eligible again after a
// confirmation, by a POST with the page's token.
func TestConsoleRetriesInboxDeadLetters(t *testing.T) {
	ctx := context.Background()
	db := dbtest.DB(t)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: dbtest.Table(t), MaxAttempts: 1})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(ctx))
	fail := func(context.Context, *sql.Tx, *amqp.Delivery) error { return errors.New("card <declined>") }
	for _, id := range []string{"m-1", "m-2"} {
		_, _ = ib.Handle(ctx, &amqp.Delivery{MessageId: id}, fail)
	}
	recs, err := ib.Records(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, recs.Dead)
	_, s, _ := parkedTable(t, []string{"no"}, outbox.Event{Type: "a"})
	h, err := console.Handler(console.Config{Stores: []*outbox.Store{s}, Inboxes: []*inbox.Inbox{ib}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := srv.Client()
	name := "billing@" + ib.Table()

	code, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	require.Regexp(t, `class="n dead"><a[^>]*>2<`, body)
	code, body = get(t, c, srv.URL+"/inbox?inbox="+url.QueryEscape(name))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 2, strings.Count(body, `class="dead"`))
	require.Contains(t, body, "card &lt;declined&gt;")
	code, body = get(t, c, srv.URL+"/confirm?action=inbox-retry&inbox="+url.QueryEscape(name)+"&id=m-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "inbox-retry 1 message of "+name)
	token := csrfField.FindStringSubmatch(body)
	require.NotNil(t, token)
	resp, err := c.PostForm(srv.URL+"/act", url.Values{"action": {"inbox-retry"}, "inbox": {name}, "id": {"m-1"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "without the token")
	resp, err = c.PostForm(srv.URL+"/act", url.Values{"action": {"inbox-retry"}, "inbox": {name}, "id": {"m-1"}, "csrf": {token[1]}})
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(b), "inbox-retry: 1 of 1 messages")
	recs, err = ib.Records(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, recs.Dead)

	// Every dead letter at once, after a confirmation that counts them.
	for _, id := range []string{"m-3", "m-4"} {
		_, _ = ib.Handle(ctx, &amqp.Delivery{MessageId: id}, fail)
	}
	code, body = get(t, c, srv.URL+"/confirm?action=inbox-retry&scope=filter&inbox="+url.QueryEscape(name))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "inbox-retry 3 messages of "+name)
	require.Contains(t, body, "<code>m-2</code>", "the sample names them")
	resp, err = c.PostForm(srv.URL+"/act", url.Values{"action": {"inbox-retry"}, "inbox": {name}, "scope": {"filter"}, "csrf": {token[1]}})
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(b), "inbox-retry: 3 messages")
	recs, err = ib.Records(ctx)
	require.NoError(t, err)
	require.Zero(t, recs.Dead)
}
