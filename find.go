package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/sqlident"
)

// FindTables returns the names of db's outbox tables that match pattern,
// sorted: a table name (see StoreConfig.Table) in which * stands for any
// run of characters and ? for one, for example "tenant_*.outbox" (the
// table outbox of every schema whose name starts with tenant_; on MySQL
// and MariaDB a schema is a database) or "*_outbox" (every table whose
// name ends with _outbox, in the connection's current schema or
// database). The names returned are qualified as the pattern is: with the
// schema when it names one, without it otherwise. Each is a name
// NewStore accepts for a Store on the table.
//
// An outbox table is one of either layout, whatever its version; the
// objects the log layout makes beside an outbox table (its partitions,
// its failed table, …), an inbox table and any other table are not. A
// relay of many tables (outbox relay --tables) calls it every few seconds
// to find the tables created since and let go of the ones dropped: it
// costs one query of the catalog, however many tables match.
//
// A pattern that is not one is refused before db is used: with a nil db,
// FindTables returns ErrNoPool for a good pattern, so a caller can check
// one before it connects.
func FindTables(ctx context.Context, db *sql.DB, pattern string) ([]string, error) {
	schema, name, err := parsePattern(pattern)
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, ErrNoPool
	}
	spoken, err := dialect.Check("outbox: FindTables", "the *sql.DB's driver speaks", dialect.OfDriver(db.Driver()))
	if err != nil {
		return nil, err
	}
	query, args := findPostgresSQL, []any{likeOf(schema), likeOf(name)}
	if spoken == dialect.MySQL {
		query, args = findMySQLSQL, []any{likeOf(schema), likeOf(schema), likeOf(name)}
	}
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: FindTables %q: %w", pattern, err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var s, n string
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("outbox: FindTables %q: %w", pattern, err)
		}
		// LIKE may be looser than the pattern (a case-insensitive
		// collation on MySQL); the store takes lowercase names only.
		if !globMatch(name, n) || (schema != "" && !globMatch(schema, s)) {
			continue
		}
		full := n
		if schema != "" {
			full = s + "." + n
		}
		if _, err := sqlident.ParseTable(full); err != nil {
			continue
		}
		found = append(found, full)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: FindTables %q: %w", pattern, err)
	}
	if spoken == dialect.MySQL {
		slices.Sort(found)
		return found, nil
	}
	// A table of the rows layout's columns may be what the log layout
	// keeps beside an outbox table (a conversion's history): ask the
	// check the stores make, which looks only at names with its suffixes.
	out := found[:0]
	for _, full := range found {
		t, err := parseTable(full)
		if err != nil {
			continue
		}
		switch err := t.checkNotSide(ctx, db); {
		case errors.Is(err, ErrInvalidTable):
			continue
		case err != nil:
			return nil, fmt.Errorf("outbox: FindTables %q: %w", pattern, err)
		}
		out = append(out, full)
	}
	slices.Sort(out)
	return out, nil
}

// findPostgresSQL lists the outbox tables whose schema is like $1 ("":
// the current schema) and whose name is like $2: tables with the rows
// layout's columns a relay uses (the payload, the claim's and
// published_at), and partitioned tables with the log layout's marker
// table beside them.
const findPostgresSQL = `SELECT n.nspname, c.relname
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND CASE WHEN $1 = '' THEN n.nspname = current_schema() ELSE n.nspname LIKE $1 ESCAPE '!' END
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg!_%' ESCAPE '!'
  AND c.relname LIKE $2 ESCAPE '!'
  AND CASE c.relkind
	WHEN 'r' THEN (SELECT count(*) FROM pg_catalog.pg_attribute AS a
		WHERE a.attrelid = c.oid AND a.attname IN ('payload', 'claim_token', 'claimed_until', 'published_at') AND NOT a.attisdropped) = 4
	ELSE EXISTS (SELECT 1 FROM pg_catalog.pg_class AS m WHERE m.relnamespace = c.relnamespace AND m.relname = c.relname || '_log' AND m.relkind = 'r')
  END
ORDER BY 1, 2`

// findMySQLSQL is findPostgresSQL on MySQL and MariaDB, whose outbox
// tables are of the rows layout; a schema is a database there.
const findMySQLSQL = `SELECT t.table_schema, t.table_name
FROM information_schema.tables AS t
WHERE t.table_type = 'BASE TABLE'
  AND CASE WHEN ? = '' THEN t.table_schema = DATABASE() ELSE t.table_schema LIKE ? ESCAPE '!' END
  AND t.table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')
  AND t.table_name LIKE ? ESCAPE '!'
  AND (SELECT count(*) FROM information_schema.columns AS c
	WHERE c.table_schema = t.table_schema AND c.table_name = t.table_name
	  AND c.column_name IN ('payload', 'claim_token', 'claimed_until', 'published_at')) = 4
ORDER BY 1, 2`

// parsePattern splits a FindTables pattern into its schema ("" when it
// names none) and table parts, each lowercase letters, digits,
// underscores and the wildcards * and ?.
func parsePattern(pattern string) (schema, name string, err error) {
	parts := strings.Split(pattern, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("outbox: FindTables: pattern %q: at most one dot is allowed (schema.table)", pattern)
	}
	for _, p := range parts {
		if p == "" {
			return "", "", fmt.Errorf("outbox: FindTables: pattern %q: a part of it is empty", pattern)
		}
		for _, c := range p {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '*' || c == '?') {
				return "", "", fmt.Errorf("outbox: FindTables: pattern %q: character %q is not allowed: a table name's (lowercase letters, digits, underscores) and the wildcards * and ?", pattern, c)
			}
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

// likeOf is a pattern part as an SQL LIKE pattern with the escape
// character '!': _ is literal there, a wildcard in LIKE.
func likeOf(p string) string {
	if p == "" {
		return ""
	}
	return strings.NewReplacer("_", "!_", "*", "%", "?", "_").Replace(p)
}

// globMatch reports whether name matches the pattern part p (which holds
// no character path.Match treats specially but * and ?).
func globMatch(p, name string) bool {
	ok, err := path.Match(p, name)
	return err == nil && ok
}
