package relay_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/internal/pgerr"
	"github.com/acemq/outbox/relay"
)

// insertRaw writes a row the way an older version, a migration or another
// program might have: past Store.Add's checks.
func (b *testBundle) insertRaw(t testing.TB, typ, exchange string, headers map[string]string) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	h, err := json.Marshal(headers)
	require.NoError(t, err)
	_, err = b.db.Exec(`INSERT INTO "`+b.store.Table()+`" (id, event_type, event_key, exchange, routing_key, payload, content_type, headers)
		VALUES ($1, $2, '', $3, $2, '\x7b7d', 'application/json', $4::jsonb)`, id, typ, exchange, string(h))
	require.NoError(t, err)
	return id
}

// poisonTest writes 10 good messages, one poison row, then 20 good ones,
// runs a relay with MaxAttempts 3, and checks that the poison row alone is
// parked (with the broker's reason) while all 30 others are delivered
// without an attempt counted against them.
func poisonTest(t *testing.T, poison func(b *testBundle) string, pub func() *relay.AMQPPublisher, wantReason string) {
	t.Helper()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 }})
	b.write(t, 10, 10, small)
	bad := poison(b)
	b.write(t, 20, 20, func(i int) outbox.Event { return small(10 + i) })
	r, _ := start(t, b.store, pub(), &relay.Config{PollInterval: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond})

	require.Eventually(t, func() bool { return b.count(t, "parked_at IS NOT NULL") == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == 30 }, 30*time.Second, 20*time.Millisecond)
	var id, lastError string
	var attempts int
	require.NoError(t, b.db.QueryRow(`SELECT id, last_error, attempts FROM `+b.messages(t)+` WHERE parked_at IS NOT NULL`).Scan(&id, &lastError, &attempts))
	require.Equal(t, bad, id)
	require.Equal(t, 3, attempts)
	require.Contains(t, lastError, wantReason)
	require.Contains(t, lastError, "published on its own")
	require.EqualValues(t, 0, b.count(t, "attempts > 0 AND id <> '"+bad+"'"), "no attempt is counted against the others")
	// The relay counts a failure once its mark returned: the third may
	// be parked before it is counted.
	require.Eventually(t, func() bool { return r.Stats().Failed == 3 }, 10*time.Second, 10*time.Millisecond, "failed %d", r.Stats().Failed)
}

// Issue 13, A1: a header larger than the AMQP frame makes the broker close
// the connection (FRAME_ERROR); the relay isolates the row, parks it after
// MaxAttempts, and every other message flows.
func TestFrameTooLargeHeaderParksOnlyItsMessage(t *testing.T) {
	t.Parallel()
	poisonTest(t, func(b *testBundle) string {
		return b.insertRaw(t, "huge.header", b.top.Exchange, map[string]string{"h": strings.Repeat("x", 200<<10)})
	}, defaultPublisher(t), "FRAME_ERROR")
}

// Issue 13, A2: publishing to an internal exchange is refused with 403
// ACCESS_REFUSED, which closes the channel without naming the message.
func TestAccessRefusedInternalExchangeParksOnlyItsMessage(t *testing.T) {
	t.Parallel()
	internal := amqptest.Exchange(t, "internal", true)
	poisonTest(t, func(b *testBundle) string {
		return b.insertRaw(t, "to.internal", internal, nil)
	}, defaultPublisher(t), "ACCESS_REFUSED")
}

// Issue 13, A2: an exchange the relay's user may not write to.
func TestAccessRefusedByPermissionsParksOnlyItsMessage(t *testing.T) {
	t.Parallel()
	user := strings.ReplaceAll(amqptest.Name(t, "u"), ".", "_")
	forbidden := amqptest.Exchange(t, "forbidden", false)
	amqptest.Ctl(t, "add_user", user, "secret-pw")
	t.Cleanup(func() { amqptest.Ctl(t, "delete_user", user) })

	var allowed string
	poisonTest(t, func(b *testBundle) string {
		allowed = b.top.Exchange
		return b.insertRaw(t, "to.forbidden", forbidden, nil)
	}, func() *relay.AMQPPublisher {
		// The user may write to the test's exchange only.
		amqptest.Ctl(t, "set_permissions", "-p", "/", user, ".*", "^"+strings.ReplaceAll(allowed, ".", `\.`)+"$", ".*")
		u, err := url.Parse(amqptest.URL())
		require.NoError(t, err)
		u.User = url.UserPassword(user, "secret-pw")
		return newPublisher(t, &relay.AMQPConfig{URL: u.String()})
	}, "ACCESS_REFUSED")
}

func defaultPublisher(t *testing.T) func() *relay.AMQPPublisher {
	return func() *relay.AMQPPublisher { return newPublisher(t, nil) }
}

// Issue 13, H: a nack says the broker could not take the message now (here
// a full queue with overflow reject-publish), not that it is bad: no
// attempt is counted, and everything arrives once the queue drains.
func TestNackIsNotTheMessagesFault(t *testing.T) {
	t.Parallel()
	const n = 60
	conn := amqptest.Conn(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	top := amqptest.Topology{Exchange: amqptest.Name(t, "x"), Queue: amqptest.Name(t, "q")}
	require.NoError(t, ch.ExchangeDeclare(top.Exchange, amqp.ExchangeTopic, false, true, false, false, nil))
	_, err = ch.QueueDeclare(top.Queue, false, false, false, false, amqp.Table{"x-max-length": int32(10), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(top.Queue, "#", top.Exchange, false, nil))
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(top.Queue, false, false, false)
		_ = ch.ExchangeDelete(top.Exchange, false, false)
		ch.Close()
	})

	store, err := outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Table: dbtest.Table(t), Router: outbox.ToExchange(top.Exchange),
		MaxAttempts: 1, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(context.Background()))
	b := &testBundle{db: dbtest.DB(t), store: store, top: top}
	b.write(t, n, n, small)
	r, _ := start(t, store, newPublisher(t, nil), &relay.Config{PollInterval: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond})

	// The queue fills up and the rest is nacked, released, tried again.
	require.Eventually(t, func() bool { return r.Stats().Released >= 2*(n-10) }, 30*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 0, b.count(t, "attempts > 0 OR parked_at IS NOT NULL"), "with MaxAttempts 1, one counted nack would have parked a message")
	require.EqualValues(t, 10, b.count(t, "published_at IS NOT NULL"))

	b.consumer = amqptest.Consume(t, conn, top.Queue)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 0, r.Stats().Failed)
}

// Issue 13, A3: a relay whose publisher was closed stops with an error
// instead of looping on "broker unavailable", and gives its claim back.
func TestClosedPublisherStopsRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, 5, 5, small)
	pub := newPublisher(t, nil)
	require.NoError(t, pub.Close())
	r, err := relay.New(b.store, pub, &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, relay.ErrPublisherClosed)
	require.NoError(t, ctx.Err(), "Run returned on its own")
	require.EqualValues(t, 5, b.count(t, "claimed_until IS NULL AND attempts = 0"), "released, no attempt counted")

	// A store without a pool cannot become one either.
	noPool, err := outbox.NewStore(nil, &outbox.StoreConfig{Table: b.store.Table()})
	require.NoError(t, err)
	r, err = relay.New(noPool, newPublisher(t, nil), &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.ErrorIs(t, r.Run(ctx), outbox.ErrNoPool)
}

// Issue 13, A3: errors that waiting will not fix are still retried (an
// operator may fix them while the relay runs) but logged at error level as
// permanent, with advice, and without the password.
func TestPermanentErrorsAreLoggedAsSuch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, 1, 1, small)
	run := func(store relay.Store, pub relay.Publisher, want string) string {
		var logs dbtest.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		r, err := relay.New(store, pub, &relay.Config{Logger: logger, BackoffMax: 200 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		require.Eventually(t, func() bool { return strings.Count(logs.String(), want) >= 2 }, 30*time.Second, 10*time.Millisecond,
			"retried, and logged each time")
		cancel()
		require.NoError(t, <-done)
		return logs.String()
	}

	u, err := url.Parse(amqptest.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("guest", "wrong-Pa55word")
	pub := newPublisher(t, &relay.AMQPConfig{URL: u.String()})
	logs := run(b.store, pub, "permanent=true")
	require.Contains(t, logs, "level=ERROR")
	require.Contains(t, logs, "RabbitMQ refused the credentials")
	require.NotContains(t, logs, "wrong-Pa55word")

	missing, err := outbox.NewStore(b.db, &outbox.StoreConfig{Table: "no_such_table_" + strings.ToLower(uuid.NewString()[:8])})
	require.NoError(t, err)
	logs = run(missing, newPublisher(t, nil), "permanent=true")
	require.Contains(t, logs, "the outbox table does not exist")
}

// Issue 13, F: a settle that fails because the database session was
// terminated is retried on a fresh connection, so the confirmed batch is
// not published again after the lease. OUTBOX_SOAK_MESSAGES raises the
// count (the figure is for 50,000).
func TestSettleRetriedAfterSessionsTerminated(t *testing.T) {
	onEveryLayout(t, testSettleRetriedAfterSessionsTerminated)
}

func testSettleRetriedAfterSessionsTerminated(t *testing.T, l outbox.Layout) {
	n := dbtest.EnvInt(t, "OUTBOX_SOAK_MESSAGES", 10_000)
	const kills = 12
	b := setupOn(t, l, nil, nil)
	b.write(t, n, 500, small)
	app := strings.ReplaceAll(amqptest.Name(t, "relay"), ".", "_")
	own, err := sql.Open("pgx", dbtest.URLWith(t, "application_name", app))
	require.NoError(t, err)
	t.Cleanup(func() { own.Close() })
	store, err := outbox.NewStore(own, &outbox.StoreConfig{Table: b.store.Table(), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	r, _ := start(t, store, newPublisher(t, nil), &relay.Config{
		BatchSize: 100, PollInterval: 10 * time.Millisecond, Lease: 5 * time.Second, PublishTimeout: 2 * time.Second, BackoffMax: 200 * time.Millisecond,
	})

	terminated := 0
	for k := 1; k <= kills; k++ {
		at := n * k / (kills + 2)
		require.Eventually(t, func() bool { return b.consumer.Distinct() >= at }, time.Minute, time.Millisecond)
		terminated += int(dbtest.Count(t, b.db, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) k`, app))
	}
	require.GreaterOrEqual(t, terminated, kills)
	require.Eventually(t, func() bool { return b.consumer.Distinct() == n }, 2*time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool { return b.pending(t) == 0 }, time.Minute, 20*time.Millisecond)
	dups := b.consumer.Total() - b.consumer.Distinct()
	rate := float64(dups) / float64(n)
	t.Logf("issue 13 F: %d messages, %d sessions terminated, %d duplicates (%.3f%%); stats %+v", n, terminated, dups, 100*rate, r.Stats())
	limit := 0.002
	if l == outbox.LayoutLog {
		// A race of the log layout, seen once in CI (100 of 10,000): a
		// take-over read a batch's settles, a late mark of the batch
		// committed before the take-over's new generation did and passed
		// its fence, and the batch was published again. The take-over now
		// takes the settle table's SHARE lock first (internal/pglog); the
		// wider limit stays until that has a history in CI. Duplicates,
		// never a loss.
		limit = 0.015
	}
	require.Less(t, rate, limit, "duplicates must stay below %.1f%%", 100*limit)
	require.EqualValues(t, 0, b.count(t, "attempts > 0"))
}

// A table that is neither layout an outbox table can have, or a log table
// of a version this library does not know, is refused: Run stops with an
// error that says what the table is not.
func TestTableOfUnknownLayoutStopsRun(t *testing.T) {
	t.Parallel()
	db := dbtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publish := relay.PublisherFunc(func(context.Context, []outbox.Message) []error {
		t.Error("nothing may be published")
		return nil
	})

	alien := dbtest.Table(t)
	_, err := db.ExecContext(ctx, `CREATE TABLE "`+alien+`" (id uuid, body text)`)
	require.NoError(t, err)
	store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: alien, Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	r, err := relay.New(store, publish, &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidTable)
	require.ErrorContains(t, err, "is neither an outbox table of the rows layout")
	require.NoError(t, ctx.Err(), "Run returned on its own")

	// A log table of a version before or after this library's (issue 47,
	// item 10: 0, 1 and 3 too), and (item 5) one whose marker row was
	// edited or deleted by hand (chunk = 0 made the relay divide by zero
	// and exit 2).
	for _, c := range []struct{ edit, says string }{
		{"UPDATE {meta} SET version = 0", "log layout of version 0"}, {"UPDATE {meta} SET version = 1", "log layout of version 1, before"},
		{"UPDATE {meta} SET version = 3", "log layout of version 3, which"}, {"UPDATE {meta} SET version = 99", "log layout of version 99, which"},
		{"UPDATE {meta} SET chunk = 0", "says chunk 0"}, {"UPDATE {meta} SET parts = -3", "parts -3"},
		{"UPDATE {meta} SET batch_chunk = 0", "batch_chunk 0"}, {"DELETE FROM {meta}", "marker row is missing"},
	} {
		table := dbtest.Table(t)
		store, err = outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		require.NoError(t, store.CreateLogSchemaIfAbsent(ctx))
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}))
		require.NoError(t, tx.Commit())
		_, err = db.ExecContext(ctx, strings.ReplaceAll(c.edit, "{meta}", `"`+table+`_log"`))
		require.NoError(t, err)
		store, err = outbox.NewStore(db, &outbox.StoreConfig{Table: table, Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		r, err = relay.New(store, publish, &relay.Config{Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		err = r.Run(ctx)
		require.ErrorIs(t, err, outbox.ErrInvalidTable, c.edit)
		require.ErrorContains(t, err, c.says, c.edit)
		t.Logf("%s: %v", c.edit, err)
	}
	require.NoError(t, ctx.Err(), "Run returned on its own")
}

// gatedPublisher confirms every message once gate is closed, and says on
// called that a batch came.
type gatedPublisher struct {
	called chan struct{}
	gate   chan struct{}
}

func (p gatedPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	select {
	case p.called <- struct{}{}:
	default:
	}
	<-p.gate
	return make([]error, len(msgs))
}

func (gatedPublisher) Close() error { return nil }

// Issue 43: a table dropped while its batch is being published (a tenant
// dropped under a relay of many tables) fails its settle once: a retry
// on another connection cannot bring a table back, so the settler does
// not retry it every second until the lease ends (which held the relay's
// shutdown, and so its group's Remove, for the lease, logging at every
// retry).
func TestSettleOnADroppedTableIsNotRetried(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"rows", "log"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbtest.DB(t)
			store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: dbtest.Table(t)})
			require.NoError(t, err)
			create := store.CreateRowsSchemaIfAbsent
			if layout == "log" {
				create = store.CreateLogSchemaIfAbsent
			}
			require.NoError(t, create(ctx))
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, store.Add(ctx, tx, outbox.Event{Type: "a"}, outbox.Event{Type: "b"}))
			require.NoError(t, tx.Commit())

			pub := gatedPublisher{called: make(chan struct{}, 1), gate: make(chan struct{})}
			var logs dbtest.Buffer
			r, err := relay.New(store, pub, &relay.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Lease: 10 * time.Second})
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			<-pub.called
			drop, err := outbox.DropSchema(store.Table())
			require.NoError(t, err)
			// The drop takes the locks of every table of the layout, and the
			// relay's upkeep (a log table's rotation) some of them in
			// another order: either may deadlock, and PostgreSQL aborts the
			// drop. An operator runs it again; so does the test.
			require.Eventually(t, func() bool {
				_, err = db.ExecContext(ctx, drop)
				return pgerr.State(err) != "40P01"
			}, 30*time.Second, 10*time.Millisecond)
			require.NoError(t, err)
			close(pub.gate)
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "Settling a batch failed") }, 30*time.Second, 10*time.Millisecond, logs.String())
			require.NotContains(t, logs.String(), "retrying on another connection", "a settle on a dropped table is not retried")
			cancel()
			<-done
		})
	}
}
