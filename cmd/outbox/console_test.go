package main

import (
	"context"
	"database/sql"
	"encoding/base64"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 44: outbox console refuses to serve beyond loopback without
// credentials, and credentials given by half; it never prints them.
func TestConsoleCommandRefusesToServeOthersWithoutCredentials(t *testing.T) {
	t.Parallel()
	code, _, errOut := outboxCmd(t, nil, "console", "--addr", "0.0.0.0:0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "reachable from other machines, and no credentials are set")
	code, _, errOut = outboxCmd(t, nil, "console", "--addr", ":0")
	require.Equal(t, 2, code, "an empty host is every interface")
	require.Contains(t, errOut, "no credentials")
	code, _, errOut = outboxCmd(t, map[string]string{"OUTBOX_CONSOLE_USER": "op"}, "console")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "go together")
	code, _, errOut = outboxCmd(t, nil, "console", "--inbox", "no-table")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "CONSUMER@TABLE")
	code, _, errOut = outboxCmd(t, nil, "console", "--inbox", "billing@inbox", "--dead-letter-queue", "other@inbox=billing.dead")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "CONSUMER@TABLE=QUEUE")
	code, out, _ := outboxCmd(t, nil, "console", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "OUTBOX_CONSOLE_TOKEN")
}

// Issue 44: outbox console --dead-letter-queue shows what waits in an
// inbox's dead-letter queue, through the broker of --amqp-url.
func TestConsoleCommandShowsADeadLetterQueue(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	table := dbtest.Table(t)
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing", Table: table})
	require.NoError(t, err)
	require.NoError(t, ib.CreateSchemaIfAbsent(context.Background()))
	ch, err := amqptest.Conn(t).Channel()
	require.NoError(t, err)
	dlq := amqptest.Name(t, "dead")
	_, err = ch.QueueDeclare(dlq, false, true, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", dlq, false, false, amqp.Publishing{MessageId: "m-1", Body: []byte(`{}`)}))
	name := "billing@" + table
	url, logs, stop, done := startConsole(t, nil, "--addr", "127.0.0.1:0", "--table", table, "--inbox", name,
		"--dead-letter-queue", name+"="+dlq, "--amqp-url", amqptest.URL())
	defer stop()
	want := "Dead-letter queue <code>" + dlq + "</code>: <b>1</b> message waiting"
	var body string
	_ = dbtest.Await(context.Background(), 10*time.Second, func() bool {
		_, body = get(t, url+"inbox?inbox="+name)
		return strings.Contains(body, want)
	})
	require.Contains(t, body, want, "the page counts the message in the queue")
	stop()
	require.Equal(t, 0, <-done, logs.String())
}

// startConsole runs outbox console with args until cancel; it returns
// the URL it serves once it does.
func startConsole(t *testing.T, env map[string]string, args ...string) (string, *dbtest.Buffer, context.CancelFunc, <-chan int) {
	t.Helper()
	var stdout, stderr dbtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	codes := make(chan int, 1)
	go func() {
		codes <- run(ctx, append([]string{"console"}, args...), &stdout, &stderr, func(k string) string {
			if v, ok := env[k]; ok {
				return v
			}
			return map[string]string{"DATABASE_URL": dbtest.URL()}[k]
		})
	}()
	serving := regexp.MustCompile(`msg="console: Serving" url=(http://\S+)`)
	var url string
	require.Eventually(t, func() bool {
		select {
		case code := <-codes:
			t.Fatalf("outbox console ended with %d:\n%s", code, stderr.String())
		default:
		}
		if m := serving.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
		}
		return url != ""
	}, 30*time.Second, 10*time.Millisecond)
	return url, &stderr, cancel, codes
}

// chromium is the path of a Chromium to drive: CHROMIUM, or Debian's.
// Without one the browser tests skip, unless OUTBOX_REQUIRE_BROWSER is
// set (CI sets it, having installed Debian's chromium).
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if os.Getenv("OUTBOX_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium (install Debian's chromium, or set CHROMIUM)")
	}
	t.Skip("no Chromium: install Debian's chromium (OUTBOX_REQUIRE_BROWSER=1 makes this a failure)")
	return ""
}

// page is a headless Chromium's tab that sends auth with every request.
type page struct {
	t   *testing.T
	ctx context.Context
}

func browser(t *testing.T, auth string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1400, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(auth))}})
		return err
	})))
	return &page{t: t, ctx: ctx}
}

// do runs steps, within a minute.
func (p *page) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	require.NoError(p.t, chromedp.Do(ctx, steps...))
}

// open navigates to url and waits for sel.
func (p *page) open(url, sel string) {
	p.t.Helper()
	p.do(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(sel)))
}

// follow clicks sel, awaits the page it loads, then wait.
func (p *page) follow(sel, wait string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.WaitEvent(cdppage.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel))))
	require.NoError(p.t, err, "clicking %s", sel)
	p.do(chromedp.WaitVisible(chromedp.CSS(wait)))
}

func (p *page) text(sel string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(p.t, err, "the text of %s", sel)
	return v
}

func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(p.t, err, expr)
	return v
}

// shot saves the page as DIR/name.png when OUTBOX_CONSOLE_SCREENSHOTS
// names a DIR.
func (p *page) shot(name string) {
	p.t.Helper()
	dir := os.Getenv("OUTBOX_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	require.NoError(p.t, err)
	require.NoError(p.t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// parkTo writes an event routed to queue and parks it (a store of one
// attempt fails it once), with why as its last error; it returns its id.
func parkTo(t *testing.T, db *sql.DB, table, queue, why string) string {
	t.Helper()
	ctx := context.Background()
	s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1})
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := s.AddIDs(ctx, tx, outbox.Event{Type: queue, Key: "k-" + why, Payload: []byte(`{"why":"` + why + `"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	msgs, err := s.Claim(ctx, 1, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, ids[0], msgs[0].ID)
	require.NoError(t, s.MarkFailed(ctx, msgs[0], why))
	return ids[0]
}

// Issue 44, in a real browser against PostgreSQL and RabbitMQ: the
// overview shows the backlog that exists; a parked message is found by
// filtering on its error, retried from the page after a confirmation,
// and then published by a relay; a discard asks first and changes
// nothing until confirmed; a POST whose CSRF token was taken out of the
// form is refused. OUTBOX_CONSOLE_SCREENSHOTS=DIR saves the pages.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	_, queue, deliveries := amqptest.ManualQueue(t, "console")
	retryID := parkTo(t, db, store.Table(), queue, "NOT_FOUND - no exchange 'billing' in vhost '/'")
	discardID := parkTo(t, db, store.Table(), queue, "PRECONDITION_FAILED - message too large")
	writeEvents(t, db, store, queue, 3)

	url, logs, stop, done := startConsole(t, map[string]string{"OUTBOX_CONSOLE_TOKEN": "s3cret-token"},
		"--addr", "127.0.0.1:0", "--table", store.Table())
	defer stop()
	b := browser(t, "operator:s3cret-token")
	row := `tr[data-table="` + store.Table() + `"]`
	b.open(url, row)
	b.shot("overview")
	require.Equal(t, "5", b.text(row+` td.pending`), "three ready and two parked")
	require.Equal(t, "2", b.text(row+` td.parked`))

	// Found by its error, retried after a confirmation.
	b.follow(row+` td.parked a`, `#filter`)
	b.do(chromedp.SendKeys(chromedp.CSS(`#filter input[name="error"]`), "no exchange"))
	b.follow(`#apply`, `#parked`)
	b.shot("parked")
	require.Equal(t, []string{retryID}, eval[[]string](b, `[...document.querySelectorAll("tr.msg")].map(r => r.dataset.id)`),
		"the filter finds the one parked by the missing exchange")
	b.do(chromedp.Click(chromedp.CSS(`tr.msg[data-id="` + retryID + `"] input[type="checkbox"]`)))
	b.follow(`#retry-chosen`, `#confirm`)
	b.shot("confirm")
	require.Contains(t, b.text(`#question`), "retry 1 message of "+store.Table())
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Parked, "the confirmation changes nothing")
	b.follow(`#confirm`, `#done`)
	require.Equal(t, "retry: 1 of 1 messages", b.text(`#done`))
	st, err = store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked)
	require.Contains(t, logs.String(), `msg="console: retry" table=`+store.Table()+` by=operator@`)

	// A relay publishes it, with the backlog.
	cancelRelay, relayDone := startRelay(t, &dbtest.Buffer{}, &dbtest.Buffer{}, "--table", store.Table())
	seen := map[string]bool{}
	for range 4 {
		select {
		case d := <-deliveries:
			require.NoError(t, d.Ack(false))
			seen[d.MessageId] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("the relay published %d of 4", len(seen))
		}
	}
	cancelRelay()
	require.Equal(t, 0, <-relayDone)
	require.True(t, seen[retryID], "the retried message was published")
	require.False(t, seen[discardID])

	// The table's page charts what was published: the four, in the last
	// minute or two, a bar a minute.
	b.open(url+"table?table="+store.Table(), `#chart`)
	b.shot("table")
	require.Equal(t, 60, eval[int](b, `document.querySelectorAll("#chart rect.bar").length`))
	require.Equal(t, 4, eval[int](b, `[...document.querySelectorAll("#chart rect.bar title")]
		.map(t => +t.textContent.match(/\((\d+) messages\)/)[1]).reduce((a, b) => a + b, 0)`))
	require.Greater(t, eval[float64](b, `Math.max(...[...document.querySelectorAll("#chart rect.bar")].map(r => r.getBBox().height))`), 0.0,
		"the bars are drawn")

	// A discard asks first; its form without the CSRF token is refused.
	b.open(url+"parked?table="+store.Table(), `#parked`)
	b.do(chromedp.Click(chromedp.CSS(`tr.msg[data-id="` + discardID + `"] input[type="checkbox"]`)))
	b.follow(`#discard-chosen`, `#confirm`)
	require.Contains(t, b.text(`#question`), "discard 1 message")
	require.Contains(t, b.text(`p.warn`), "never published")
	st, err = store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked, "asking changes nothing")
	eval[any](b, `document.querySelector('input[name="csrf"]').remove()`)
	b.follow(`#confirm`, `#error`)
	require.Contains(t, b.text(`#error`), "CSRF token is missing")
	st, err = store.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked, "the refused POST discarded nothing")

	// Confirmed, it is discarded; the token appears on no page.
	b.open(url+"confirm?action=discard&table="+store.Table()+"&id="+discardID, `#confirm`)
	b.follow(`#confirm`, `#done`)
	require.NotContains(t, eval[string](b, `document.documentElement.outerHTML`), "s3cret-token")
	st, err = store.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Parked)
	require.Zero(t, st.Pending)

	// Without the credentials, nothing.
	code, _ := get(t, url)
	require.Equal(t, http.StatusUnauthorized, code)
	stop()
	require.Equal(t, 0, <-done, logs.String())
	require.NotContains(t, logs.String(), "s3cret-token")
}

// Issue 44: the console adds no load on the database while no page is
// open: after it starts, its sessions run no statement over a window of
// two seconds (their state_change stays put, and no session comes), and
// a page asked for then is served by them.
func TestConsoleQueriesNothingWhileNoPageIsOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.DB(t)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchemaIfAbsent(ctx))
	app := "console_" + store.Table()[len(store.Table())-10:]
	url, _, stop, done := startConsole(t, map[string]string{"DATABASE_URL": dbtest.URLWith(t, "application_name", app)},
		"--addr", "127.0.0.1:0", "--table", store.Table())
	defer stop()
	sessions := func() string {
		t.Helper()
		var s string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT coalesce(string_agg(pid || ':' || state_change, ',' ORDER BY pid), '')
			FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&s))
		return s
	}
	before := sessions()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		require.Equal(t, before, sessions(), "a statement ran with no page open")
		time.Sleep(100 * time.Millisecond) // sampling a window, not waiting for an event
	}
	code, _ := get(t, url)
	require.Equal(t, http.StatusOK, code)
	require.NotEqual(t, before, sessions(), "the page's statements show (the check can see them)")
	stop()
	require.Equal(t, 0, <-done)
}
