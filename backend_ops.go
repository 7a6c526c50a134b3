package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/acemq/outbox/internal/backend"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/mysqlstore"
	"github.com/acemq/outbox/internal/textcut"
)

// Database is the database an outbox table is kept in.
type Database int

const (
	// PostgreSQL, version 13 or later: both layouts, ordered tables,
	// LISTEN/NOTIFY wake-ups (package pgwake).
	PostgreSQL Database = iota + 1

	// MySQL, version 8.0 or later, and MariaDB, 10.6 or later (what
	// FOR UPDATE SKIP LOCKED needs): one table of one row per message
	// (LayoutRows), unordered; a relay in another process polls (see
	// relay.Config.PollInterval). Tested on MariaDB 10.11.
	MySQL
)

// String returns "PostgreSQL" or "MySQL".
func (d Database) String() string {
	switch d {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	}
	return fmt.Sprintf("Database(%d)", int(d))
}

// chooseDatabase is the database of a new Store: the one its pool's driver
// speaks, else the configured one, else PostgreSQL. A configuration that
// contradicts the pool is an error.
func chooseDatabase(db *sql.DB, configured Database, spoken string) (Database, error) {
	return chosen(db != nil, configured, spoken, "outbox: NewStore", "the *sql.DB's driver speaks")
}

// chosen is chooseDatabase of what the caller who was told (spoken:
// dialect.Check's answer; told: whether there was anything to tell from).
func chosen(told bool, configured Database, spoken, who, what string) (Database, error) {
	if configured != 0 && configured != PostgreSQL && configured != MySQL {
		return 0, fmt.Errorf("outbox: StoreConfig.Database must be PostgreSQL or MySQL (got %d)", int(configured))
	}
	found := Database(0)
	if told {
		switch spoken {
		case dialect.Unknown, dialect.Postgres:
			found = PostgreSQL
		case dialect.MySQL:
			found = MySQL
		}
	}
	switch {
	case found != 0 && configured != 0 && found != configured:
		return 0, fmt.Errorf("%s: the store's database is %s, and %s %s", who, configured, what, found)
	case found != 0:
		return found, nil
	case configured != 0:
		return configured, nil
	}
	return PostgreSQL, nil
}

// newBackend returns the backend of a table on a database other than
// PostgreSQL (whose two layouts are rowsOps and logOps), nil on PostgreSQL.
func newBackend(d Database, t table) backend.Backend {
	if d != MySQL {
		return nil
	}
	schema, _, _ := strings.Cut(t.full, ".")
	if schema == t.full {
		schema = ""
	}
	return mysqlstore.New(schema, t.name)
}

// backendClaim is the claim a backend wrote in the rows it claimed.
type backendClaim string

func (backendClaim) claimRef() {}

// backendOps is a table kept by a backend of package backend: MySQL's.
type backendOps struct{ *Store }

// fromRow is the Message of a backend's row: headers decoded (a row that
// cannot be relayed as written is unfit).
func fromRow(r backend.Row) Message {
	m := Message{ID: r.ID, Seq: r.Seq, EventType: r.EventType, Key: r.Key, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
		Payload: r.Payload, ContentType: r.ContentType, CreatedAt: r.CreatedAt, Attempts: r.Attempts, LastError: r.LastError,
		ClaimedUntil: r.ClaimedUntil, ParkedAt: r.ParkedAt}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	m.decodeHeaders(r.Headers)
	return m
}

func fromRows(rows []backend.Row, claimed bool) []Message {
	msgs := make([]Message, len(rows))
	for i, r := range rows {
		msgs[i] = fromRow(r)
		if claimed {
			msgs[i].claim = backendClaim(r.Claim)
		}
	}
	return msgs
}

func (b backendOps) claim(ctx context.Context, db *sql.DB, n int, lease time.Duration) ([]Message, error) {
	rows, err := b.be.Claim(ctx, db, n, lease, b.batchMaxBytes)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	msgs := fromRows(rows, true)
	token := rows[0].Claim
	return b.parkEach(ctx, msgs, false,
		func(id, reason string) (int, error) {
			seq := seqOf(msgs, id)
			f, ok, err := b.be.Fail(ctx, db, seq, token, reason, 0, 1)
			if err == nil && !ok {
				err = sql.ErrNoRows
			}
			return f.Attempts, err
		},
		func([]string) error { return nil }) // nothing waits behind: unordered
}

func seqOf(msgs []Message, id string) int64 {
	for _, m := range msgs {
		if m.ID == id {
			return m.Seq
		}
	}
	return 0
}

func (b backendOps) settle(ctx context.Context, db *sql.DB, what string, kind byte, msgs []Message) error {
	var (
		claims []backendClaim // in order of first appearance
		seqs   = map[backendClaim][]int64{}
		done   = make(map[int64]bool, len(msgs))
	)
	for _, m := range msgs {
		c, ok := m.claim.(backendClaim)
		if !ok {
			continue // claimed from another table's kind: lost below
		}
		if _, ok := seqs[c]; !ok {
			claims = append(claims, c)
		}
		seqs[c] = append(seqs[c], m.Seq)
	}
	for _, c := range claims {
		marked, err := b.be.Settle(ctx, db, kind == 'p', string(c), seqs[c])
		if err != nil {
			return fmt.Errorf("outbox: %s %d message(s) in %s: %w", what, len(msgs), b.t.full, err)
		}
		for _, q := range marked {
			done[q] = true
		}
	}
	var lost []string
	for _, m := range msgs {
		if _, ok := m.claim.(backendClaim); !ok || !done[m.Seq] {
			lost = append(lost, m.ID)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return b.leaseLost(ctx, what, lost)
}

func (b backendOps) markFailed(ctx context.Context, db *sql.DB, msg Message, reason string) error {
	c, ok := msg.claim.(backendClaim)
	if !ok {
		return b.leaseLost(ctx, "marking failed", []string{msg.ID})
	}
	reason = textcut.Cut(strings.ReplaceAll(reason, "\x00", ""), lastErrorMax)
	f, ok, err := b.be.Fail(ctx, db, msg.Seq, string(c), reason, b.backoff(msg.Attempts+1), b.maxAttempts)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: marking message %s failed in %s: %w", msg.ID, b.t.full, err)
	case !ok:
		return b.leaseLost(ctx, "marking failed", []string{msg.ID})
	case f.Parked:
		b.warnParked(ctx, msg.ID, f.Attempts, reason)
	}
	return nil
}

func (backendOps) maintain(context.Context, *sql.DB) error { return nil }

func (b backendOps) pending(ctx context.Context, db *sql.DB) (int64, error) {
	n, err := b.be.Pending(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting pending messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (b backendOps) stats(ctx context.Context, db *sql.DB) (Stats, error) {
	c, err := b.be.Counts(ctx, db, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: reading stats of %s: %w", b.t.full, err)
	}
	st := Stats{Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, PublishedLastHour: c.PublishedLastHour, BlockedKeys: c.BlockedKeys}
	st.Pending = st.Ready + st.InFlight + st.Retrying + st.Held + st.Parked
	st.Claimed = st.InFlight
	return st, nil
}

func (b backendOps) gauges(ctx context.Context, db *sql.DB, limit int64) (Gauges, error) {
	c, err := b.be.Counts(ctx, db, limit)
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox: reading gauges of %s: %w", b.t.full, err)
	}
	g := Gauges{Limit: limit, Ready: c.Ready, InFlight: c.InFlight, Retrying: c.Retrying, Held: c.Held, Parked: c.Parked,
		OldestPendingAge: c.OldestPending, OldestReadyAge: c.OldestReady, BlockedKeys: c.BlockedKeys}
	g.Pending = min(g.Ready+g.InFlight+g.Retrying+g.Held+g.Parked, limit)
	return g, nil
}

func (b backendOps) parked(ctx context.Context, db *sql.DB, limit int) ([]Message, error) {
	rows, err := b.be.Parked(ctx, db, limit)
	if err != nil {
		return nil, err
	}
	return fromRows(rows, false), nil
}

func (b backendOps) changeParked(ctx context.Context, db *sql.DB, discard bool, ids []string) (int64, error) {
	return b.be.ChangeParked(ctx, db, discard, ids)
}

// reconcile does nothing: nothing is held on an unordered table.
func (backendOps) reconcile(context.Context, *sql.DB) (held, unheld int64, err error) {
	return 0, 0, nil
}

func (b backendOps) purge(ctx context.Context, db *sql.DB, olderThan time.Duration, progress func(int64)) (int64, error) {
	n, err := b.be.Purge(ctx, db, olderThan, b.purgeBatch, progress)
	if err != nil {
		return n, fmt.Errorf("outbox: purging published messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (b backendOps) purgeable(ctx context.Context, db *sql.DB, olderThan time.Duration) (int64, error) {
	n, err := b.be.Purgeable(ctx, db, olderThan)
	if err != nil {
		return 0, fmt.Errorf("outbox: counting purgeable messages in %s: %w", b.t.full, err)
	}
	return n, nil
}

func (backendOps) orderColumn() string { return "seq" }

// readOrder finds the table unordered: it is, on every backend so far.
func (b backendOps) readOrder(context.Context, *sql.DB) (tableOrder, error) {
	b.tm.set(Unordered)
	return tableOrder{}, nil
}

// errNotOnBackend is what the operations that only PostgreSQL has return
// on another database.
func (b backendOps) errNotOnBackend(what string) error {
	return fmt.Errorf("outbox: %s: %w: %s is on %s, where tables are unordered and of LayoutRows", what, ErrUnsupportedDatabase, b.t.full, b.database)
}

func (b backendOps) convertOrdering(context.Context, *sql.DB, Ordering, bool, time.Duration) (OrderingConversion, error) {
	return OrderingConversion{}, b.errNotOnBackend("converting the ordering")
}

func (b backendOps) createRowsSchema(ctx context.Context, db *sql.DB) error {
	ddl := strings.TrimSuffix(strings.TrimSpace(b.be.SchemaSQL()), ";")
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", b.t.full, err)
	}
	return nil
}

func (b backendOps) convertToLog(context.Context, *sql.DB, bool, time.Duration) (Conversion, error) {
	return Conversion{}, b.errNotOnBackend("converting to the log layout")
}

// layout is Store.layout on a backend's table: LayoutRows when it exists.
func (b backendOps) layout(ctx context.Context, db *sql.DB) (Layout, error) {
	ok, err := b.be.Exists(ctx, db)
	switch {
	case err != nil:
		return 0, fmt.Errorf("outbox: reading the layout of %s: %w", b.t.full, err)
	case !ok:
		return 0, noTableError{b.t.full}
	}
	return LayoutRows, nil
}

// MySQLSchema returns the DDL that creates the outbox table of the given
// name on MySQL or MariaDB (see MySQL): one idempotent statement, as
// `outbox schema --database-url mysql://…` prints it and
// Store.CreateSchemaIfAbsent applies it. A schema-qualified name
// ("billing.outbox") names a database.
func MySQLSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return newBackend(MySQL, t).SchemaSQL(), nil
}

// Database returns the database the store's table is in.
func (s *Store) Database() Database { return s.database }
