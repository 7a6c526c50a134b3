package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/acemq/outbox/internal/pgerr"
)

// What a table of LayoutLog must have for relays to work on it, checked
// when a Store first reads the table (Store.Layout) and again when a
// statement says something is missing: the objects of the layout, and a
// marker row (in the meta table, <table>_log) whose sizes are those the
// tables are partitioned by. The relays compute partitions from those
// sizes: a row edited by hand (chunk = 0) made them divide by zero.

// logObject is an object of a table of LayoutLog, with what it is.
type logObject struct{ name, what string }

// objects lists the relations of a table of LayoutLog that relays need:
// every table, partition and sequence the layout's DDL creates (the view
// is for operators, and left out).
func (t table) logObjects(l logTables) []logObject {
	objs := []logObject{
		{l.batch, "batch table"}, {l.settle, "settle table"}, {l.failed, "failed table"},
		{l.seq, "sequence"}, {l.ordSeq, "ord sequence"},
	}
	for i := int64(0); i < l.parts; i++ {
		objs = append(objs, logObject{t.logPartition(i), "partition"})
	}
	for i := int64(0); i < logBatchParts; i++ {
		objs = append(objs, logObject{t.logBatchPartition(i), "batch partition"}, logObject{t.logSettlePartition(i), "settle partition"})
	}
	return objs
}

// sqlLit quotes s as an SQL string literal.
func sqlLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// The sizes a table of LayoutLog is partitioned by, as PostgreSQL prints
// its partition keys (pg_get_partkeydef): LIST ((((seq / 1000000) %
// (16)::bigint))).
var (
	logPartKey   = regexp.MustCompile(`^LIST \(+seq / (\d+)\) % \((\d+)\)::bigint\)+$`)
	batchPartKey = regexp.MustCompile(`^LIST \(+batch_id / (\d+)\) % \((\d+)\)::bigint\)+$`)
)

// partSizes reads the chunk and the partition count of a partition key.
func partSizes(re *regexp.Regexp, def sql.NullString) (chunk, parts int64, ok bool) {
	m := re.FindStringSubmatch(def.String)
	if m == nil {
		return 0, 0, false
	}
	if _, err := fmt.Sscan(m[1], &chunk); err != nil {
		return 0, 0, false
	}
	if _, err := fmt.Sscan(m[2], &parts); err != nil {
		return 0, 0, false
	}
	return chunk, parts, true
}

// readLogTables reads and checks the marker row and the objects of a
// table of LayoutLog, and returns its sizes in l, with the comment of its
// claim function. A table that is not fit for relaying is refused with an
// error wrapping ErrInvalidTable that says what is wrong; when `outbox
// schema --apply` can mend it, the layout returned is LayoutLog (so that
// the command applies the log layout's DDL), else 0.
func (s *Store) readLogTables(ctx context.Context, db *sql.DB, l logTables) (_ logTables, claimMark string, _ Layout, _ error) {
	var (
		rows                                  int64
		version, chunk, parts, bchunk, bparts sql.NullInt64
		key, bkey                             sql.NullString
		hasClaim                              bool
	)
	err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+l.meta+`), m.version, m.chunk, m.parts, m.batch_chunk, m.batch_parts,
	pg_get_partkeydef(`+sqlLit(s.t.quoted)+`::regclass), pg_get_partkeydef(to_regclass(`+sqlLit(l.batch)+`)),
	to_regprocedure($1) IS NOT NULL, coalesce(obj_description(to_regprocedure($1), 'pg_proc'), '')
FROM (SELECT 1) AS one LEFT JOIN (SELECT * FROM `+l.meta+` ORDER BY version DESC LIMIT 1) AS m ON true`, l.claimFn+logClaimArgs).
		Scan(&rows, &version, &chunk, &parts, &bchunk, &bparts, &key, &bkey, &hasClaim, &claimMark)
	if err != nil {
		return l, "", 0, fmt.Errorf("outbox: reading the layout of %s: %w", s.t.full, err)
	}
	repair := "`outbox schema --layout log --apply --table " + s.t.full + "` (Store.CreateLogSchemaIfAbsent)"
	kchunk, kparts, ok := partSizes(logPartKey, key)
	if !ok || kchunk < 1 || kparts < 3 {
		return l, "", 0, fmt.Errorf("%w: %s has the marker table of the log layout (%s), but it is not partitioned as the log layout partitions its events (by %s): is it an outbox table?",
			ErrInvalidTable, s.t.full, l.meta, key.String)
	}
	l.chunk, l.parts = kchunk, kparts
	if rows == 0 {
		return l, "", LayoutLog, fmt.Errorf("%w: %s is a table of the log layout whose marker row is missing (%s is empty: deleted by hand?): %s makes it again",
			ErrInvalidTable, s.t.full, l.meta, repair)
	}
	if version.Int64 < logVersion {
		return l, "", LayoutLog, fmt.Errorf("%w: %s has the log layout of version %d, before this version of the library (log layout %d): bring it up to date with `outbox schema --layout log --apply` (Store.CreateLogSchemaIfAbsent), which is idempotent and takes a moment",
			ErrInvalidTable, s.t.full, version.Int64, logVersion)
	}
	if version.Int64 != logVersion {
		return l, "", 0, fmt.Errorf("%w: %s has the log layout of version %d, which this version of the library (log layout %d) does not know",
			ErrInvalidTable, s.t.full, version.Int64, logVersion)
	}
	kbchunk, kbparts, bok := partSizes(batchPartKey, bkey)
	if !bkey.Valid {
		bok = true // the batch table is missing: said below
		kbchunk, kbparts = bchunk.Int64, logBatchParts
	}
	if !bok || kbchunk < 1 || kbparts != logBatchParts {
		return l, "", 0, fmt.Errorf("%w: the batch table of %s (%s) is not partitioned as the log layout partitions it (by %s): is it an outbox table?",
			ErrInvalidTable, s.t.full, l.batch, bkey.String)
	}
	l.batchChunk = kbchunk
	if rows > 1 || chunk.Int64 != kchunk || parts.Int64 != kparts || bchunk.Int64 != kbchunk || bparts.Int64 != kbparts {
		return l, "", LayoutLog, fmt.Errorf("%w: the marker row of %s (in %s) says chunk %d, parts %d, batch_chunk %d, batch_parts %d (%d row(s)), but its tables are partitioned by chunk %d, parts %d, batch_chunk %d, batch_parts %d (one row): it was changed by hand; %s sets it back",
			ErrInvalidTable, s.t.full, l.meta, chunk.Int64, parts.Int64, bchunk.Int64, bparts.Int64, rows, kchunk, kparts, kbchunk, kbparts, repair)
	}
	if missing, err := s.missingLogObjects(ctx, db, l, hasClaim); err != nil {
		return l, "", 0, err
	} else if missing != "" {
		return l, "", LayoutLog, fmt.Errorf("%w: %s is a table of the log layout that lacks %s (dropped by hand?): %s creates what is missing; what a dropped table held is lost (a settle or batch table: messages may be published again; the failed table: the messages that had failed are lost, restore it from a backup)",
			ErrInvalidTable, s.t.full, missing, repair)
	}
	return l, claimMark, LayoutLog, nil
}

// missingLogObjects names the objects of the log table that do not exist,
// or returns "".
func (s *Store) missingLogObjects(ctx context.Context, db *sql.DB, l logTables, hasClaim bool) (string, error) {
	objs := s.t.logObjects(l)
	var q strings.Builder
	q.WriteString("SELECT x.i FROM (VALUES ")
	for i, o := range objs {
		if i > 0 {
			q.WriteByte(',')
		}
		fmt.Fprintf(&q, "(%d, %s)", i, sqlLit(o.name))
	}
	q.WriteString(") AS x(i, name) WHERE to_regclass(x.name) IS NULL ORDER BY x.i")
	rows, err := db.QueryContext(ctx, q.String())
	if err != nil {
		return "", fmt.Errorf("outbox: reading the layout of %s: %w", s.t.full, err)
	}
	defer rows.Close()
	var missing []string
	gone := map[string]bool{}
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return "", fmt.Errorf("outbox: reading the layout of %s: %w", s.t.full, err)
		}
		o := objs[i]
		gone[o.what] = true
		if parent, ok := strings.CutSuffix(o.what, " partition"); ok && gone[parent+" table"] {
			continue // dropped with its table
		}
		missing = append(missing, "its "+o.what+" "+o.name)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("outbox: reading the layout of %s: %w", s.t.full, err)
	}
	if !hasClaim {
		missing = append(missing, "its claim function "+l.claimFn+logClaimArgs)
	}
	return strings.Join(missing, ", "), nil
}

// logFault explains the error of a statement on a table of LayoutLog that
// says an object is missing (a table, a column, a function): it reads the
// table again and, when the table is not fit for relaying, returns the
// error that says why (it wraps ErrInvalidTable, and err); otherwise err.
// The next call reads the table again either way.
func (s *Store) logFault(ctx context.Context, err error) error {
	switch pgerr.State(err) {
	case "42P01", "42883", "42703":
	default:
		return err
	}
	s.forgetLayout()
	if _, _, lerr := (pgStorage{s}).readLayout(ctx); errors.Is(lerr, ErrInvalidTable) {
		return fmt.Errorf("%w (%v)", lerr, err)
	}
	return err
}

// The objects the log layout creates beside an outbox table, by the
// suffix of their names: none of them is an outbox table.
var (
	logSideSuffixes = []struct{ suffix, what string }{
		{"_log", "marker table"}, {"_batch", "batch table"}, {"_settle", "settle table"}, {"_failed", "failed table"},
		{"_messages", "messages view"}, {"_seq", "sequence"}, {"_ord_seq", "ord sequence"},
		{"_rows", "rows-layout history"},
	}
	logSidePartition = regexp.MustCompile(`^(.+)(_p\d{2}|_batch_p\d|_settle_p\d)$`)
)

// checkNotSide refuses a table that is one of the objects the log layout
// created beside an outbox table (its failed table, a partition, …), or
// would be, or the sequence of a table of the rows layout: relaying it,
// or applying a layout's DDL to it, would damage the outbox it belongs to.
func (t table) checkNotSide(ctx context.Context, db *sql.DB) error {
	type candidate struct{ owner, what string }
	var cands []candidate
	for _, sfx := range logSideSuffixes {
		if owner, ok := strings.CutSuffix(t.name, sfx.suffix); ok && owner != "" {
			cands = append(cands, candidate{owner, sfx.what})
		}
	}
	if m := logSidePartition.FindStringSubmatch(t.name); m != nil {
		what := "partition"
		switch {
		case strings.HasPrefix(m[2], "_batch_"):
			what = "batch partition"
		case strings.HasPrefix(m[2], "_settle_"):
			what = "settle partition"
		}
		cands = append(cands, candidate{m[1], what})
	}
	for _, c := range cands {
		owner := table{quoted: t.qualified(c.owner), name: c.owner, full: c.owner}
		if i := strings.LastIndexByte(t.full, '.'); i >= 0 {
			owner.full = t.full[:i+1] + c.owner
		}
		var isLog, isRows bool
		err := db.QueryRowContext(ctx, `SELECT coalesce(c.relkind = 'p', false) AND to_regclass($2) IS NOT NULL,
	coalesce(c.relkind = 'r', false) AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = 'published_at' AND NOT attisdropped)
FROM (SELECT to_regclass($1) AS oid) AS r LEFT JOIN pg_class AS c ON c.oid = r.oid`, owner.quoted, owner.qualified(c.owner+"_log")).Scan(&isLog, &isRows)
		if err != nil {
			return fmt.Errorf("outbox: reading the layout of %s: %w", t.full, err)
		}
		if isLog || (isRows && c.what == "sequence") {
			layout := LayoutLog
			if !isLog {
				layout = LayoutRows
			}
			return fmt.Errorf("%w: %s is the %s of %s, an outbox table of the %s layout, not an outbox table: name %s (or another table) instead",
				ErrInvalidTable, t.full, c.what, owner.full, layout, owner.full)
		}
	}
	return nil
}
