package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Defaults and limits of StoreConfig.
const (
	// MaxAttemptsDefault is how many failed attempts park a message unless
	// StoreConfig.MaxAttempts says otherwise.
	MaxAttemptsDefault = 10

	// PurgeBatchSizeDefault is how many rows one purge statement deletes.
	PurgeBatchSizeDefault = 5000

	// insertChunk is the most rows one INSERT carries. Larger writes are
	// split into several statements, still in the caller's transaction; the
	// SQL text of each row count is built once and reused.
	insertChunk = 100

	// lastErrorMax bounds the reason stored by MarkFailed, in bytes.
	lastErrorMax = 2000
)

// BackoffFunc returns how long a message waits after its n-th failed attempt
// (n ≥ 1) before it may be claimed again.
type BackoffFunc func(attempt int) time.Duration

// ExponentialBackoff returns a BackoffFunc that doubles from base with every
// attempt up to limit, each delay picked at random between half and all of
// its nominal value, so that messages that failed together do not all come
// back together.
func ExponentialBackoff(base, limit time.Duration) BackoffFunc {
	return func(attempt int) time.Duration {
		d := limit
		if attempt < 1 {
			attempt = 1
		}
		if attempt < 40 {
			if n := base << (attempt - 1); n > 0 && n < limit {
				d = n
			}
		}
		if d <= 1 {
			return d
		}
		return d/2 + rand.N(d/2+1)
	}
}

// StoreConfig configures a Store. The zero value (and nil) gives the defaults.
type StoreConfig struct {
	// Backoff decides how long a failed message waits before it is tried
	// again. Defaults to ExponentialBackoff(time.Second, 10*time.Minute).
	Backoff BackoffFunc

	// Headers adds headers to every written event, taken from the writer's
	// context (trace context, tenant, …). Defaults to none.
	Headers HeaderFunc

	// Logger receives the store's warnings (lost leases, parked messages).
	// Defaults to slog.Default().
	Logger *slog.Logger

	// MaxAttempts is how many failed attempts park a message: it is then
	// never claimed again until an operator retries it. Defaults to 10.
	MaxAttempts int

	// PurgeBatchSize is how many rows one statement of PurgePublished deletes,
	// keeping each statement (and its locks and WAL) small. Defaults to 5000.
	PurgeBatchSize int

	// Router chooses exchange and routing key for events that do not set
	// their own. Defaults to ToExchange(""): the broker's default exchange,
	// routing key = event type.
	Router Router

	// Table is the outbox table, optionally schema-qualified
	// ("billing.outbox"). Lowercase letters, digits and underscores only.
	// Defaults to "outbox".
	Table string
}

// Store is an outbox kept in a PostgreSQL table, in the same database as the
// data whose changes it announces.
//
// A Store has two sources of connections, on purpose. Add writes through the
// transaction the caller passes in and nothing else, so an event commits or
// rolls back with the change it describes. Everything the relay does —
// claiming, marking, counting, purging — runs on the Store's own pool, in
// short statements of its own, and never holds a transaction open while a
// message travels to the broker.
//
// A Store is safe for concurrent use.
type Store struct {
	db          *sql.DB
	t           table
	backoff     BackoffFunc
	headers     HeaderFunc
	logger      *slog.Logger
	maxAttempts int
	purgeBatch  int
	router      Router

	q       queries
	inserts [insertChunk + 1]string // INSERT text by row count, built on first use
	insMu   sync.Mutex
}

// NewStore returns a Store on the table that cfg names. db is the relay's own
// pool: it is never used by Add. It may be nil for a Store that only writes
// (as the ORM plugins do); the relay-side methods then return ErrNoPool.
// NewStore does not touch the database.
func NewStore(db *sql.DB, cfg *StoreConfig) (*Store, error) {
	if cfg == nil {
		cfg = &StoreConfig{}
	}
	t, err := parseTable(cmp.Or(cfg.Table, TableDefault))
	if err != nil {
		return nil, err
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("outbox: StoreConfig.MaxAttempts must not be negative (got %d)", cfg.MaxAttempts)
	}
	if cfg.PurgeBatchSize < 0 {
		return nil, fmt.Errorf("outbox: StoreConfig.PurgeBatchSize must not be negative (got %d)", cfg.PurgeBatchSize)
	}
	s := &Store{
		db:          db,
		t:           t,
		backoff:     cfg.Backoff,
		headers:     cfg.Headers,
		logger:      cfg.Logger,
		maxAttempts: cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault),
		purgeBatch:  cmp.Or(cfg.PurgeBatchSize, PurgeBatchSizeDefault),
		router:      cfg.Router,
		q:           newQueries(t),
	}
	if s.backoff == nil {
		s.backoff = ExponentialBackoff(time.Second, 10*time.Minute)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if s.router == nil {
		s.router = ToExchange("")
	}
	return s, nil
}

// Table returns the table name the store works on, as configured.
func (s *Store) Table() string { return s.t.full }

// MaxAttempts returns how many failed attempts park a message.
func (s *Store) MaxAttempts() int { return s.maxAttempts }

// Execer is what Add writes through: the caller's open transaction.
// *sql.Tx, *sql.Conn inside a transaction, GORM's transaction ConnPool and
// ent's generated *Tx (with the sql/execquery feature) all satisfy it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

const insertColumns = 8 // id, event_type, event_key, exchange, routing_key, payload, content_type, headers

// Add writes events into the outbox through tx, the caller's open
// transaction, so that they are published if and only if that transaction
// commits. Add never uses the Store's own pool.
//
// All events of one call go out in one INSERT (several for more than 100
// events). tx must be a transaction: passing a *sql.DB, which would commit
// each statement on its own, returns ErrNoTransaction and writes nothing. An
// event without a Type returns an error wrapping ErrInvalidEvent and nothing
// is written.
func (s *Store) Add(ctx context.Context, tx Execer, evts ...Event) error {
	if len(evts) == 0 {
		return nil
	}
	if tx == nil {
		return ErrNoTransaction
	}
	if _, ok := tx.(*sql.DB); ok {
		return ErrNoTransaction
	}
	var base map[string]string
	if s.headers != nil {
		base = s.headers(ctx)
	}
	// Every row is built, and so every event checked, before the first
	// INSERT: a bad event anywhere in the call writes nothing.
	args := make([]any, 0, len(evts)*insertColumns)
	for i := range evts {
		row, err := s.rowArgs(&evts[i], base)
		if err != nil {
			return err
		}
		args = append(args, row[:]...)
	}
	for start := 0; start < len(evts); start += insertChunk {
		n := min(insertChunk, len(evts)-start)
		chunk := args[start*insertColumns : (start+n)*insertColumns]
		if _, err := tx.ExecContext(ctx, s.insertSQL(n), chunk...); err != nil {
			return fmt.Errorf("outbox: writing %d event(s) into %s: %w", n, s.t.full, err)
		}
	}
	return nil
}

func (s *Store) rowArgs(e *Event, base map[string]string) ([insertColumns]any, error) {
	var row [insertColumns]any
	if e.Type == "" {
		return row, fmt.Errorf("%w: Type is empty; every event needs a type such as \"order.placed\"", ErrInvalidEvent)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return row, fmt.Errorf("outbox: generating message id: %w", err)
	}
	exchange, key := s.router(*e)
	if e.Exchange != "" {
		exchange = e.Exchange
	}
	if e.RoutingKey != "" {
		key = e.RoutingKey
	}
	if err := checkShortStrings(e, exchange, key); err != nil {
		return row, err
	}
	headers := []byte("{}")
	if len(base)+len(e.Headers) > 0 {
		merged := make(map[string]string, len(base)+len(e.Headers))
		for k, v := range base {
			merged[k] = v
		}
		for k, v := range e.Headers {
			merged[k] = v
		}
		if headers, err = json.Marshal(merged); err != nil {
			return row, fmt.Errorf("outbox: encoding headers of %q event: %w", e.Type, err)
		}
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	row = [insertColumns]any{id.String(), e.Type, e.Key, exchange, key, payload, cmp.Or(e.ContentType, ContentTypeDefault), string(headers)}
	return row, nil
}

// shortStrMax is the longest AMQP 0-9-1 short string: exchange and queue
// names, routing keys, message properties and header names.
const shortStrMax = 255

// checkShortStrings refuses an event the broker could never take, at write
// time, where the error reaches the code that made it.
func checkShortStrings(e *Event, exchange, key string) error {
	for _, f := range []struct{ what, v string }{
		{"Type", e.Type}, {"ContentType", e.ContentType}, {"exchange", exchange}, {"routing key", key},
	} {
		if len(f.v) > shortStrMax {
			return fmt.Errorf("%w: the %s of %.40q… is %d bytes; AMQP allows at most %d", ErrInvalidEvent, f.what, e.Type, len(f.v), shortStrMax)
		}
	}
	for k := range e.Headers {
		if len(k) > shortStrMax {
			return fmt.Errorf("%w: header name %.40q… of %.40q is %d bytes; AMQP allows at most %d", ErrInvalidEvent, k, e.Type, len(k), shortStrMax)
		}
	}
	return nil
}

// insertSQL returns the INSERT statement for n rows, built once per n so that
// drivers and pools that prepare statements see a small, fixed set of texts.
func (s *Store) insertSQL(n int) string {
	s.insMu.Lock()
	defer s.insMu.Unlock()
	if q := s.inserts[n]; q != "" {
		return q
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.t.quoted + " (id, event_type, event_key, exchange, routing_key, payload, content_type, headers) VALUES ")
	p := 1
	for r := 0; r < n; r++ {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := 0; c < insertColumns; c++ {
			if c > 0 {
				b.WriteByte(',')
			}
			b.WriteString("$" + strconv.Itoa(p))
			if c == insertColumns-1 {
				b.WriteString("::jsonb")
			}
			p++
		}
		b.WriteByte(')')
	}
	s.inserts[n] = b.String()
	return s.inserts[n]
}

func (s *Store) pool() (*sql.DB, error) {
	if s.db == nil {
		return nil, ErrNoPool
	}
	return s.db, nil
}

// Claim takes up to n messages that are ready to publish and leases them to
// the caller for the given duration, by the database clock. It returns them
// oldest first, and an empty slice when there is nothing to do.
//
// A claim is a lease, not a lock: no transaction stays open, and if the
// claimer dies the rows become claimable again when the lease ends. The lease
// must therefore be comfortably longer than publishing a batch takes, and no
// longer than a stalled message may wait. Each call takes a fresh claim
// token, which MarkPublished, MarkFailed and Release check.
func (s *Store) Claim(ctx context.Context, n int, lease time.Duration) ([]Message, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("outbox: Claim: batch size must be at least 1 (got %d)", n)
	}
	if lease < time.Millisecond {
		return nil, fmt.Errorf("outbox: Claim: lease must be at least 1ms (got %s)", lease)
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("outbox: generating claim token: %w", err)
	}
	rows, err := db.QueryContext(ctx, s.q.claim, n, lease.Microseconds(), token.String())
	if err != nil {
		return nil, fmt.Errorf("outbox: claiming from %s: %w", s.t.full, err)
	}
	msgs, err := scanMessages(rows, token.String())
	if err != nil {
		return nil, fmt.Errorf("outbox: claiming from %s: %w", s.t.full, err)
	}
	sortByID(msgs)
	return msgs, nil
}

func scanMessages(rows *sql.Rows, token string) ([]Message, error) {
	defer rows.Close()
	var msgs []Message
	for rows.Next() {
		var (
			m        Message
			headers  []byte
			claimed  sql.NullTime
			parkedAt sql.NullTime
		)
		if err := rows.Scan(&m.ID, &m.EventType, &m.Key, &m.Exchange, &m.RoutingKey, &m.Payload,
			&m.ContentType, &headers, &m.CreatedAt, &m.Attempts, &m.LastError, &claimed, &parkedAt); err != nil {
			return nil, err
		}
		if len(headers) > 2 {
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				return nil, fmt.Errorf("decoding headers of message %s: %w", m.ID, err)
			}
		}
		m.ClaimedUntil = claimed.Time
		m.ParkedAt = parkedAt.Time
		m.claimToken = token
		msgs = append(msgs, m)
	}
	return msgs, rows.Err()
}

// MarkPublished records that the messages reached the broker. It changes
// only rows that still carry the caller's claim; the others are reported in
// a *LeaseLostError (errors.Is(err, ErrLeaseLost)) after the rest have been
// marked. Such a message was claimed again by another relay, which may
// publish it a second time: a duplicate, never a loss.
func (s *Store) MarkPublished(ctx context.Context, msgs ...Message) error {
	return s.fenced(ctx, "marking published", s.q.markPublished, msgs)
}

// Release gives claims back without counting an attempt: the messages can be
// claimed again at once. A relay releases what it claimed but did not get to
// publish (shutdown, broker outage). Rows no longer carrying the caller's
// claim are left alone and reported like MarkPublished does.
func (s *Store) Release(ctx context.Context, msgs ...Message) error {
	return s.fenced(ctx, "releasing", s.q.release, msgs)
}

// fenced runs an UPDATE for the messages of each claim token and reports
// the messages that matched no row as lost leases.
func (s *Store) fenced(ctx context.Context, what, query string, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	var (
		tokens []string // in order of first appearance
		ids    = make(map[string][]string)
	)
	for _, m := range msgs {
		if m.claimToken == "" {
			return fmt.Errorf("outbox: %s message %s: it was not returned by Claim, so it carries no claim", what, m.ID)
		}
		if _, ok := ids[m.claimToken]; !ok {
			tokens = append(tokens, m.claimToken)
		}
		ids[m.claimToken] = append(ids[m.claimToken], m.ID)
	}
	done := make(map[string]bool, len(msgs))
	for _, token := range tokens {
		if err := s.fencedClaim(ctx, db, query, ids[token], token, done); err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), s.t.full, err)
		}
	}
	if len(done) == len(msgs) {
		return nil
	}
	var lost []string
	for _, m := range msgs {
		if !done[m.ID] {
			lost = append(lost, m.ID)
		}
	}
	return s.leaseLost(ctx, what, lost)
}

// leaseLost logs and returns the error for messages whose claim was lost.
func (s *Store) leaseLost(ctx context.Context, what string, ids []string) error {
	s.logger.WarnContext(ctx, "outbox: Lease lost", slog.String("table", s.t.full),
		slog.String("operation", what), slog.Int("num_lost", len(ids)), slog.String("first_id", ids[0]))
	return &LeaseLostError{IDs: ids}
}

func (s *Store) fencedClaim(ctx context.Context, db *sql.DB, query string, ids []string, token string, done map[string]bool) error {
	rows, err := db.QueryContext(ctx, query, ids, token)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		done[id] = true
	}
	return rows.Err()
}

// MarkFailed records a failed attempt to publish msg: it adds one to the
// attempt count, keeps reason for whoever reads the table, releases the claim
// and makes the message claimable again after the store's backoff. The
// attempt that reaches MaxAttempts parks the message instead: it stays in the
// table, counted by Pending and listed by Parked, until Retry re-arms it.
//
// Only a message that is the message's fault should be marked failed; when
// the broker is down, Release it so that no attempt is burnt. Like
// MarkPublished, MarkFailed leaves alone a row whose claim was lost and
// returns a *LeaseLostError.
func (s *Store) MarkFailed(ctx context.Context, msg Message, reason string) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	if msg.claimToken == "" {
		return fmt.Errorf("outbox: marking message %s failed: it was not returned by Claim, so it carries no claim", msg.ID)
	}
	if len(reason) > lastErrorMax {
		reason = strings.ToValidUTF8(reason[:lastErrorMax], "") + "…"
	}
	delay := s.backoff(msg.Attempts + 1)
	var (
		attempts int
		parked   bool
	)
	err = db.QueryRowContext(ctx, s.q.markFailed, msg.ID, msg.claimToken, reason, delay.Microseconds(), s.maxAttempts).Scan(&attempts, &parked)
	if errors.Is(err, sql.ErrNoRows) {
		return s.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	if err != nil {
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, s.t.full, err)
	}
	if parked {
		s.logger.WarnContext(ctx, "outbox: Message parked after too many failed attempts",
			slog.String("table", s.t.full), slog.String("outbox_id", msg.ID), slog.Int("attempts", attempts),
			slog.String("last_error", truncate(reason, 200)))
	}
	return nil
}

// Pending returns how many messages are not yet published, counting those
// currently claimed, those waiting out a backoff and those parked.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRowContext(ctx, s.q.pending).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting pending messages in %s: %w", s.t.full, err)
	}
	return n, nil
}

// Stats is a snapshot of an outbox table for operators and metrics.
type Stats struct {
	// Pending counts unpublished messages, including claimed and parked ones.
	Pending int64
	// Claimed counts messages under a lease that has not expired.
	Claimed int64
	// Parked counts messages that exhausted their attempts.
	Parked int64
	// OldestPendingAge is how long the oldest unpublished message has been
	// waiting (zero when nothing is pending).
	OldestPendingAge time.Duration
	// PublishedLastHour counts messages published in the last hour.
	PublishedLastHour int64
}

// Stats returns counts of the table's messages by state.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	db, err := s.pool()
	if err != nil {
		return Stats{}, err
	}
	var (
		st     Stats
		oldest float64
	)
	if err := db.QueryRowContext(ctx, s.q.stats).Scan(&st.Pending, &st.Claimed, &st.Parked, &oldest, &st.PublishedLastHour); err != nil {
		return Stats{}, fmt.Errorf("outbox: reading stats of %s: %w", s.t.full, err)
	}
	st.OldestPendingAge = time.Duration(oldest * float64(time.Second)).Round(time.Millisecond)
	return st, nil
}

// Parked returns up to limit parked messages, the most recently parked
// first, with their attempt counts and last errors.
func (s *Store) Parked(ctx context.Context, limit int) ([]Message, error) {
	db, err := s.pool()
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("outbox: Parked: limit must be at least 1 (got %d)", limit)
	}
	rows, err := db.QueryContext(ctx, s.q.parked, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked messages in %s: %w", s.t.full, err)
	}
	msgs, err := scanMessages(rows, "")
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked messages in %s: %w", s.t.full, err)
	}
	return msgs, nil
}

// Retry re-arms parked messages: their attempt count starts again from zero
// and they can be claimed at once. Ids that are not parked are ignored. It
// returns how many messages were re-armed.
func (s *Store) Retry(ctx context.Context, ids ...string) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	for _, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			return 0, fmt.Errorf("outbox: Retry: %q is not a message id (a UUID)", id)
		}
	}
	return s.execCount(ctx, db, "retrying parked messages", s.q.retry, ids)
}

// RetryAllParked re-arms every parked message, as Retry does, and returns how
// many there were.
func (s *Store) RetryAllParked(ctx context.Context) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	return s.execCount(ctx, db, "retrying parked messages", s.q.retryAll)
}

func (s *Store) execCount(ctx context.Context, db *sql.DB, what, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s in %s: %w", what, s.t.full, err)
	}
	return res.RowsAffected()
}

// PurgePublished deletes published messages older than olderThan and
// returns how many it deleted. Unpublished messages are never touched. It
// works in batches of StoreConfig.PurgeBatchSize rows, one short statement
// each, so that a large purge neither locks much at once nor holds one long
// transaction; cancelling ctx stops it between batches, keeping what was
// deleted so far.
//
// Nothing else deletes published rows. How long to keep them is a question of
// auditing rather than messaging, so the caller decides.
func (s *Store) PurgePublished(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.PurgePublishedProgress(ctx, olderThan, nil)
}

// PurgePublishedProgress is PurgePublished that calls progress with the
// running total after every batch.
func (s *Store) PurgePublishedProgress(ctx context.Context, olderThan time.Duration, progress func(deleted int64)) (int64, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: PurgePublished: age must not be negative (got %s)", olderThan)
	}
	var cutoff time.Time
	if err := db.QueryRowContext(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: purging %s: %w", s.t.full, err)
	}
	var total int64
	for {
		n, err := s.execCount(ctx, db, "purging published messages", s.q.purge, cutoff, s.purgeBatch)
		total += n
		if err != nil {
			return total, err
		}
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(s.purgeBatch) {
			return total, nil
		}
	}
}

// CreateSchemaIfAbsent creates the outbox table and its indexes if they do
// not exist yet.
//
// It is meant for development and tests. In production the table belongs to
// the migrations that own the rest of your schema (see Migrations, Schema,
// and `outbox schema`): when your database changes is not a library's
// decision to take at start-up.
func (s *Store) CreateSchemaIfAbsent(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	// Concurrent CREATE ... IF NOT EXISTS of one table can still collide in
	// the catalog; a transaction-scoped advisory lock serialises them.
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "outbox:"+s.t.quoted); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	if _, err := tx.ExecContext(ctx, s.t.createSQL()); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	return nil
}
