package outbox

// PostgreSQL's storage: its two layouts (the table records which: rows or
// log), its writes and its schema.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/acemq/outbox/internal/pgerr"
	"github.com/acemq/outbox/internal/pglog"
	"github.com/acemq/outbox/internal/pgrows"
	"github.com/acemq/outbox/internal/pgschema"
)

// pgStorage is a table on PostgreSQL (see storage): of LayoutRows (rowsOps)
// or LayoutLog (logOps), as the table records, read once (layoutState).
type pgStorage struct{ *Store }

// pgState is what a Store keeps of a table on PostgreSQL: pgStorage's, and
// its layouts' ops'.
type pgState struct {
	rows  *pgrows.Backend // the queue of a table of the rows layout
	turns keyTurns        // Add's statements that take the turns of its keys
	layoutState
	inserts [insertChunk + 1]string // INSERT text by row count, built on first use
	insMu   sync.Mutex
}

// layoutState caches the layout of a Store's table, read once from the
// database.
type layoutState struct {
	layoutMu    sync.Mutex
	layoutKnown Layout
	log         *pglog.Backend // the queue of a table of the log layout
	logT        logTables      // its objects, as read from the table
}

// ops returns the operations of the table's layout, read from the table
// (once, see readLayout).
func (s pgStorage) ops(ctx context.Context) (layoutOps, error) {
	ls, err := s.logged(ctx)
	switch {
	case err != nil:
		return nil, err
	case ls != nil:
		return logOps{queueOps{s.Store, ls}, s.logT}, nil
	}
	return s.rowsOps(), nil
}

// rowsOps is the operations of a table of the rows layout.
func (s pgStorage) rowsOps() rowsOps { return rowsOps{queueOps{s.Store, s.rows}} }

// forget makes the next call read the table's layout again.
func (s pgStorage) forget() {
	s.layoutMu.Lock()
	s.layoutKnown = 0
	s.layoutMu.Unlock()
}

// tableChanged forgets the layout when err says that a column, the table
// or a function of the layout is missing.
func (s pgStorage) tableChanged(err error) error {
	switch pgerr.State(err) {
	case "42703", "42P01", "42883":
		s.forgetLayout()
	}
	return err
}

// createSchema is CreateSchemaIfAbsent on PostgreSQL: a table that does not
// exist is made of the log layout; one that does keeps its layout.
func (s pgStorage) createSchema(ctx context.Context, db *sql.DB) error {
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", s.t.quoted).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: creating schema of %s: %w", s.t.full, err)
	}
	if !exists {
		return s.createLogSchema(ctx, db)
	}
	switch l, err := s.layout(ctx); {
	case l == LayoutLog: // of an older version too: brought up to date
		return s.createLogSchema(ctx, db)
	case err != nil:
		return err
	}
	return s.createRowsSchema(ctx, db)
}

// createRowsSchema is CreateRowsSchemaIfAbsent on PostgreSQL: nothing on a
// table of the log layout.
func (s pgStorage) createRowsSchema(ctx context.Context, db *sql.DB) error {
	ops, err := s.ops(ctx)
	switch {
	case errors.As(err, new(noTableError)):
		ops = s.rowsOps()
	case err != nil:
		return err
	}
	return ops.createRowsSchema(ctx, db)
}

// createLogSchema is CreateLogSchemaIfAbsent on PostgreSQL.
func (s pgStorage) createLogSchema(ctx context.Context, db *sql.DB) error {
	if err := s.t.checkNotSide(ctx, db); err != nil {
		return err
	}
	ddl := s.t.logSQL(s.t.logTables()) + s.t.scheduledSQL()
	if s.order.configured == OrderedByKey {
		ddl += s.t.logOrderDDL(s.t.logTables())
	}
	if err := pgschema.Apply(ctx, db, "outbox:"+s.t.quoted, ddl); err != nil {
		return fmt.Errorf("outbox: creating log schema of %s: %w%s", s.t.full, err, DuplicateIDsAdvice(s.t.full, err))
	}
	s.forgetLayout()
	return nil
}

// hasNotifyTrigger looks for NotifySchema's trigger.
func (s pgStorage) hasNotifyTrigger(ctx context.Context, db *sql.DB) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2)`,
		s.t.quoted, s.t.trigger()).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("outbox: looking for the NOTIFY trigger of %s: %w", s.t.full, err)
	}
	return ok, nil
}

// layout is Store.Layout on PostgreSQL.
func (s pgStorage) layout(ctx context.Context) (Layout, error) {
	l, _, err := s.readLayout(ctx)
	return l, err
}

// readLayout is layout, and returns the table's log backend with it (nil
// for the rows layout), read under the same lock: a change of layout
// (tableChanged) makes the next call read the table again and replace the
// log backend.
func (s pgStorage) readLayout(ctx context.Context) (Layout, *pglog.Backend, error) {
	db, err := s.pool()
	if err != nil {
		return 0, nil, err
	}
	s.layoutMu.Lock()
	defer s.layoutMu.Unlock()
	if s.layoutKnown != 0 {
		return s.layoutKnown, s.log, nil
	}
	if err := s.t.checkNotSide(ctx, db); err != nil {
		return 0, nil, err
	}
	l := s.t.logTables()
	var (
		kind          sql.NullString
		rows, hasMeta bool
	)
	err = db.QueryRowContext(ctx, `SELECT c.relkind::text,
	EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = 'published_at' AND NOT attisdropped),
	to_regclass($2) IS NOT NULL
FROM (SELECT to_regclass($1) AS oid) AS r LEFT JOIN pg_class AS c ON c.oid = r.oid`, s.t.quoted, l.meta).Scan(&kind, &rows, &hasMeta)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox: reading the layout of %s: %w", s.t.full, err)
	}
	switch {
	case !kind.Valid:
		return 0, nil, noTableError{s.t.full}
	case hasMeta && kind.String == "p":
		checked, claimMark, layout, err := s.readLogTables(ctx, db, l)
		if err != nil {
			return layout, nil, err
		}
		if rev := claimRevision(claimMark); rev < logClaimRevision {
			s.logger.WarnContext(ctx, "outbox: The table's claim function is older than this version of the library's: relaying works, but each claim costs more than it needs to; `outbox schema --layout log --apply` (Store.CreateLogSchemaIfAbsent) replaces it online",
				slog.String("table", s.t.full), slog.Int("claim_revision", rev), slog.Int("current_revision", logClaimRevision))
		}
		// Read again (a statement found the table changed): the new log
		// backend starts where the old one's low-water mark was, not from
		// the first batch.
		old := s.log
		s.log, s.logT = pglog.New(s.t.pglog(checked), pglog.Config{Logger: s.logger, Unfit: headersUnfit}), checked
		s.log.Inherit(old)
		s.layoutKnown = LayoutLog
	case rows && kind.String == "r":
		s.layoutKnown = LayoutRows
	default:
		return 0, nil, fmt.Errorf("%w: %s is neither an outbox table of the rows layout (no published_at column) nor one of the log layout (no %s table): is it an outbox table?",
			ErrInvalidTable, s.t.full, l.meta)
	}
	return s.layoutKnown, s.log, nil
}

// logged returns the log backend when the table has LayoutLog, nil for the
// rows layout, and the error when the layout cannot be read (the table is
// missing, the database does not answer): the rows layout's statements
// never run on a table whose layout is not known.
func (s pgStorage) logged(ctx context.Context) (*pglog.Backend, error) {
	if s.db == nil {
		return nil, nil
	}
	l, ls, err := s.readLayout(ctx)
	if err != nil {
		return nil, err
	}
	if l == LayoutLog {
		return ls, nil
	}
	return nil, nil
}

// explainWrite marks a unique violation of the table's primary key (an
// event's ID already written) with ErrDuplicateID, and explains a pooler in
// the way.
func (s pgStorage) explainWrite(err error) error {
	switch pgerr.State(err) {
	case "23505":
		// The DETAIL of a unique violation names the key: "Key (id)=(…)
		// already exists."
		if id, ok := strings.CutPrefix(pgerr.Detail(err), "Key (id)=("); ok {
			if id, ok = strings.CutSuffix(id, ") already exists."); ok {
				return fmt.Errorf("%w: %s is already in %s: %w", ErrDuplicateID, id, s.t.full, err)
			}
		}
		return fmt.Errorf("%w: an event's ID is already in %s: %w", ErrDuplicateID, s.t.full, err)
	case "42P05", "26000":
		return fmt.Errorf("%w (%s)", err, PoolerHint)
	}
	return err
}

// arrayElem escapes a quoted element of a PostgreSQL array literal.
var arrayElem = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// lockKeys makes the writers of each key of evts take turns, in the order
// of their slots. A store in ordered mode takes them always. An unordered
// one, when evts have several keys and the table may be ordered (its
// trigger would take them row by row, and two writers could deadlock),
// takes them if the table is ordered, and learns that it is not for a while.
func (s pgStorage) lockKeys(ctx context.Context, tx Execer, evts []Event) error {
	ordered := s.order.configured == OrderedByKey
	if !ordered && (len(evts) < 2 || s.order.knownUnordered()) {
		return nil // the common write of an unordered store: nothing to gather
	}
	var keys []string
	for i := range evts {
		if evts[i].Key != "" {
			keys = append(keys, evts[i].Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if !ordered && len(keys) < 2 {
		return nil
	}
	// An array literal rather than a []string: the writer's driver is the
	// application's, and not every driver takes slices.
	var lit strings.Builder
	lit.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			lit.WriteByte(',')
		}
		lit.WriteByte('"')
		arrayElem.WriteString(&lit, k)
		lit.WriteByte('"')
	}
	lit.WriteByte('}')
	if ordered {
		if _, err := tx.ExecContext(ctx, s.turns.lock, s.t.full, lit.String(), s.t.keyTurnSetting(), s.t.qualified(s.t.orderTrigger())); err != nil {
			return fmt.Errorf("outbox: taking the keys of %d event(s) in %s: %w", len(evts), s.t.full, err)
		}
		return nil
	}
	res, err := tx.ExecContext(ctx, s.turns.lockIfOrdered, s.t.full, lit.String(), s.t.keyTurnSetting(), s.t.qualified(s.t.orderTrigger()),
		s.t.quoted, s.t.orderTrigger())
	if err != nil {
		return fmt.Errorf("outbox: taking the keys of %d event(s) in %s: %w", len(evts), s.t.full, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		s.order.observe(Unordered) // not ordered: skip this statement for a while
	}
	return nil
}

// insertSQL returns the INSERT statement for n rows, built once per n so that
// drivers and pools that prepare statements see a small, fixed set of texts.
func (s pgStorage) insertSQL(n int) string {
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
