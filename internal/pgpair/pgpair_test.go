package pgpair_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/acemq/outbox/internal/pgpair"
)

// The pair replicates, and after a crash of the primary and the standby's
// promotion, the pair's URL finds the new primary, with what was written
// synchronously before.
func TestPairFailsOver(t *testing.T) {
	p := pgpair.Start(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (n int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := p.A.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `INSERT INTO t VALUES (2) RETURNING (SELECT count(*) FROM t)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the new primary had %d rows before the insert, want 1", n)
	}
}
