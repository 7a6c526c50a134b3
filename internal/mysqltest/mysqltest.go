// Package mysqltest gives tests a database of their own on the real
// MySQL or MariaDB named by TEST_MYSQL_DSN, to check that the library
// refuses it. A server that cannot be reached fails the test with
// instructions; it is never a silent skip.
package mysqltest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// DSNDefault is used when TEST_MYSQL_DSN is not set.
const DSNDefault = "root@tcp(127.0.0.1:3306)/test"

// DSN returns the DSN of a database no other test uses, created now and
// dropped when the test ends, on the server of TEST_MYSQL_DSN.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv("TEST_MYSQL_DSN")
	if dsn == "" {
		dsn = DSNDefault
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("mysqltest: TEST_MYSQL_DSN: %v", err)
	}
	// A drop that waits for a transaction a failed test left open gives
	// up after 10s (MariaDB's default is a year).
	ac := cfg.Clone()
	if ac.Params == nil {
		ac.Params = map[string]string{}
	}
	ac.Params["lock_wait_timeout"] = "10"
	admin, err := sql.Open("mysql", ac.FormatDSN())
	if err != nil {
		tb.Fatalf("mysqltest: %v", err)
	}
	tb.Cleanup(func() { admin.Close() })
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "outbox_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		tb.Fatalf("mysqltest: cannot create a database on MySQL/MariaDB at %s (is it up? set TEST_MYSQL_DSN): %v", cfg.Addr, err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE " + name); err != nil {
			tb.Errorf("mysqltest: dropping database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// DB returns a pool on a database of the test's own (DSN).
func DB(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", DSN(tb))
	if err != nil {
		tb.Fatalf("mysqltest: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
