package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
)

// poolWrapper hides a *sql.DB behind a type of its own: an Execer that
// cannot be shown to be a transaction.
type poolWrapper struct{ *sql.DB }

// cancellingExecer cancels the context after the first INSERT it passes on.
type cancellingExecer struct {
	*sql.Tx
	cancel  context.CancelFunc
	inserts int
}

func (c *cancellingExecer) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	res, err := c.Tx.ExecContext(ctx, q, args...)
	if strings.HasPrefix(q, "INSERT") {
		if c.inserts++; c.inserts == 1 {
			c.cancel()
		}
	}
	return res, err
}

// Issue 13, C7 and D9: only a provable transaction is written through, and
// misuse is an error, never a panic or a row committed on its own.
func TestAddRefusesWhatIsNotATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()

	for name, ex := range map[string]outbox.Execer{
		"nil":         nil,
		"nil *sql.Tx": (*sql.Tx)(nil),
		"*sql.DB":     b.db,
		"*sql.Conn":   conn,
		"wrapped DB":  poolWrapper{b.db},
	} {
		err := b.store.Add(ctx, ex, events(1)...)
		require.ErrorIs(t, err, outbox.ErrNoTransaction, name)
		// Even with no events, a wrong Execer is a bug worth reporting.
		require.ErrorIs(t, b.store.Add(ctx, ex), outbox.ErrNoTransaction, name)
	}
	require.ErrorContains(t, b.store.Add(ctx, (*sql.Tx)(nil), events(1)...), "did BeginTx fail?")
	require.ErrorContains(t, b.store.Add(ctx, poolWrapper{b.db}, events(1)...), "outbox_test.poolWrapper has no Commit and Rollback")
	require.Zero(t, b.count(t, ""), "nothing may be written, let alone committed")
}

// Issue 13, C8: a context cancelled between the INSERTs of a large Add
// leaves none of its rows in the transaction, which stays usable.
func TestAddCancelledMidwayLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	tx, err := b.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	require.NoError(t, b.store.Add(context.Background(), tx, outbox.Event{Type: "before"}))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ex := &cancellingExecer{Tx: tx, cancel: cancel}
	err = b.store.Add(ctx, ex, events(250)...)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, ex.inserts, "the first INSERT went through, the second met the cancelled context")

	// A caller who ignores the error and commits keeps only what came before.
	require.NoError(t, tx.Commit())
	require.EqualValues(t, 1, b.count(t, ""))
	require.EqualValues(t, 1, b.count(t, "event_type = 'before'"))
}

// Issue 13, A2: what the database or the broker could never take is refused
// at write time with ErrInvalidEvent, not with a raw PostgreSQL error that
// aborts the caller's transaction, nor by silently changing it.
func TestAddRefusesWhatCannotBeSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	big := strings.Repeat("h", 200<<10)
	for name, c := range map[string]struct {
		evt  outbox.Event
		want string
	}{
		"header of 200 KiB":          {outbox.Event{Type: "x", Headers: map[string]string{"h": big}}, "more than the 65536 of HeadersMaxBytes"},
		"key of 200 KiB":             {outbox.Event{Type: "x", Key: big}, "the Key is 204800 bytes; at most 2048 (KeyMaxBytes)"},
		"many headers":               {outbox.Event{Type: "x", Headers: manyHeaders(100, 1000)}, "HeadersMaxBytes"},
		"NUL in type":                {outbox.Event{Type: "x\x00y"}, "Type is not valid UTF-8 text or holds a NUL byte"},
		"NUL in key":                 {outbox.Event{Type: "x", Key: "k\x00"}, "Key is not valid UTF-8"},
		"NUL in header value":        {outbox.Event{Type: "x", Headers: map[string]string{"h": "\x00"}}, `value of header "h"`},
		"invalid UTF-8 in type":      {outbox.Event{Type: "x\xff"}, "Type is not valid UTF-8"},
		"invalid UTF-8 in key":       {outbox.Event{Type: "x", Key: "\xc3"}, "Key is not valid UTF-8"},
		"invalid UTF-8 header name":  {outbox.Event{Type: "x", Headers: map[string]string{"\xff": "v"}}, "header name"},
		"invalid UTF-8 header value": {outbox.Event{Type: "x", Headers: map[string]string{"h": "\xff"}}, `value of header "h"`},
		"invalid UTF-8 exchange":     {outbox.Event{Type: "x", Exchange: "\xff"}, "exchange is not valid UTF-8"},
		"invalid UTF-8 routing key":  {outbox.Event{Type: "x", RoutingKey: "a\x00"}, "routing key is not valid UTF-8"},
		"invalid UTF-8 content type": {outbox.Event{Type: "x", ContentType: "\xff"}, "ContentType is not valid UTF-8"},
		"empty header name":          {outbox.Event{Type: "x", Headers: map[string]string{"": "v"}}, "a header name is empty"},
		"x-event-key header":         {outbox.Event{Type: "x", Key: "k", Headers: map[string]string{outbox.KeyHeader: "other"}}, "reserved for Event.Key"},
	} {
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		err = b.store.Add(ctx, tx, outbox.Event{Type: "good"}, c.evt)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
		require.ErrorContains(t, err, c.want, name)
		require.ErrorContains(t, err, "event 2 of 2", name)
		// The transaction is untouched: the business change can still commit.
		_, err = tx.ExecContext(ctx, "SELECT 1")
		require.NoError(t, err, name)
		require.NoError(t, tx.Rollback())
	}
	require.Zero(t, b.count(t, ""))

	// A key header from StoreConfig.Headers would also disagree with the
	// table: refused the same way.
	withBase := setup(t, &outbox.StoreConfig{Headers: func(context.Context) map[string]string {
		return map[string]string{outbox.KeyHeader: "from-context"}
	}})
	tx, err := withBase.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	require.ErrorIs(t, withBase.store.Add(ctx, tx, outbox.Event{Type: "x"}), outbox.ErrInvalidEvent)

	// Just under the limit is fine, and arrives unchanged.
	ok := outbox.Event{Type: "ünïcode.ok", Key: "ключ", Headers: map[string]string{"h": strings.Repeat("v", 60<<10)}}
	b.addCommitted(t, ok)
	msgs, err := b.store.Claim(ctx, 1, 60e9)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, ok.Type, msgs[0].EventType)
	require.Equal(t, ok.Key, msgs[0].Key)
	require.Equal(t, ok.Headers, msgs[0].Headers)
}

func manyHeaders(n, size int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[strings.Repeat("k", 1+i%200)+string(rune('a'+i%26))+strings.Repeat("x", i/26)] = strings.Repeat("v", size)
	}
	return h
}

// Issue 13, G: a claim is bounded by bytes as well as by rows, decided in
// the claim query, and always returns at least one message.
func TestClaimIsBoundedByBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &outbox.StoreConfig{BatchMaxBytes: 1 << 20})
	payload := bytes.Repeat([]byte("p"), 300<<10)
	for range 10 {
		b.addCommitted(t, outbox.Event{Type: "big", Payload: payload})
	}
	msgs, err := b.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 4, "0, 300, 600 and 900 KiB come before them: the fourth still starts under 1 MiB")
	msgs, err = b.store.Claim(ctx, 2, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "the row bound still holds")

	huge := setup(t, &outbox.StoreConfig{BatchMaxBytes: 1000})
	huge.addCommitted(t, outbox.Event{Type: "huge", Payload: payload}, outbox.Event{Type: "next"})
	msgs, err = huge.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "a message larger than the bound comes alone")
	require.Equal(t, "huge", msgs[0].EventType)
	require.Len(t, msgs[0].Payload, len(payload))
	msgs, err = huge.store.Claim(ctx, 100, time.Minute)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "next", msgs[0].EventType)

	_, err = outbox.NewStore(nil, &outbox.StoreConfig{BatchMaxBytes: -1})
	require.ErrorContains(t, err, "BatchMaxBytes must not be negative")
}

// Issue 9, item 3: Add wakes the relays of its table in this process.
func TestAddWakesSubscribers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	other := setup(t, nil)
	wake, cancel := b.store.Subscribe()
	otherWake, cancelOther := other.store.Subscribe()
	defer cancelOther()

	b.addCommitted(t, events(2)...)
	select {
	case <-wake:
	default:
		t.Fatal("Add did not wake the table's subscriber")
	}
	select {
	case <-otherWake:
		t.Fatal("a write to one table woke the relays of another")
	default:
	}
	cancel()
	cancel() // idempotent
	b.addCommitted(t, events(1)...)
	select {
	case <-wake:
		t.Fatal("a cancelled subscription still receives")
	default:
	}
}

// Issue 10, item 3: the gauges count up to a limit, from partial indexes.
func TestGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &outbox.StoreConfig{MaxAttempts: 1})
	g, err := b.store.Gauges(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, outbox.Gauges{Limit: outbox.GaugesLimitDefault}, g)

	b.addCommitted(t, events(5)...)
	msgs, err := b.store.Claim(ctx, 2, time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.store.MarkPublished(ctx, msgs[0]))
	require.NoError(t, b.store.MarkFailed(ctx, msgs[1], "parked"))
	_, err = b.db.Exec(`UPDATE "` + b.table + `" SET created_at = now() - interval '1 hour'`)
	require.NoError(t, err)

	g, err = b.store.Gauges(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 4, g.Pending, "3 ready and 1 parked")
	require.EqualValues(t, 3, g.Ready)
	require.EqualValues(t, 1, g.Parked)
	require.EqualValues(t, 1, g.BlockedKeys, "the parked message's key")
	require.InDelta(t, time.Hour.Seconds(), g.OldestPendingAge.Seconds(), 60)

	g, err = b.store.Gauges(ctx, 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, g.Pending, "the count stops at the limit")
	require.EqualValues(t, 2, g.Limit)
}

func TestHasNotifyTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	ok, err := b.store.HasNotifyTrigger(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	ddl, err := outbox.NotifySchema(b.table)
	require.NoError(t, err)
	_, err = b.db.Exec(ddl)
	require.NoError(t, err)
	ok, err = b.store.HasNotifyTrigger(ctx)
	require.NoError(t, err)
	require.True(t, ok)
}

// Issue 18, item 9: a caller sets an event's id, or learns the one Add
// assigned; a second event with an id already written is a clear error.
func TestEventIDsSetAndReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	const mine = "0190F5C2-7E3A-7B1C-9D2E-3F4A5B6C7D8E"
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	ids, err := b.store.AddIDs(ctx, tx, outbox.Event{Type: "order.placed", ID: mine}, outbox.Event{Type: "order.paid"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Len(t, ids, 2)
	require.Equal(t, strings.ToLower(mine), ids[0], "the caller's id, in canonical form")
	_, err = uuid.Parse(ids[1])
	require.NoError(t, err)
	msgs, err := b.store.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, []string{msgs[0].ID, msgs[1].ID}, "the ids reported are the messages' ids")

	// The same event written again: a clear error, and the first stands.
	tx, err = b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	err = b.store.Add(ctx, tx, outbox.Event{Type: "order.placed", ID: strings.ToLower(mine)})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)
	require.ErrorContains(t, err, "already in")
	require.NoError(t, tx.Rollback())

	// Two events of one call with one id, and an id that is no UUID:
	// refused before anything is written.
	tx, err = b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	other := uuid.NewString()
	_, err = b.store.AddIDs(ctx, tx, outbox.Event{Type: "a", ID: other}, outbox.Event{Type: "b", ID: other})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)
	require.ErrorContains(t, err, "event 2 of 2")
	err = b.store.Add(ctx, tx, outbox.Event{Type: "a", ID: "order-42"})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	require.ErrorContains(t, err, `ID "order-42" is not a UUID`)
	require.EqualValues(t, 2, b.count(t, "true"))
}
