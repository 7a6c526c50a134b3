package main

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql" // and the "mysql" database/sql driver
)

// mysqlDSN returns the go-sql-driver DSN of a MySQL or MariaDB database:
// a URL (mysql://user:pass@host:3306/db?tls=true, or mariadb://), or a DSN
// as go-sql-driver/mysql takes it (user:pass@tcp(host:3306)/db). ok is
// false for anything else: a PostgreSQL URL or keyword/value string.
// Errors never hold the password.
func mysqlDSN(s string) (dsn string, ok bool, err error) {
	switch {
	case strings.HasPrefix(s, "mysql://"), strings.HasPrefix(s, "mariadb://"):
		u, err := url.Parse(s)
		if err != nil {
			return "", true, fmt.Errorf("the database URL (%s) is not a valid MySQL URL", redactDSN(s))
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net = "tcp"
		host, port := u.Hostname(), u.Port()
		cfg.Addr = net.JoinHostPort(host, cmpOr(port, "3306"))
		if host == "" {
			cfg.Addr = "127.0.0.1:" + cmpOr(port, "3306")
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		dsn = cfg.FormatDSN()
		if u.RawQuery != "" {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + u.RawQuery
		}
	case isMySQLDSN(s):
		dsn = s
	default:
		return "", false, nil
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return "", true, fmt.Errorf("the database URL (%s) is not a valid MySQL URL or DSN: %s", redactDSN(s), strings.ReplaceAll(err.Error(), dsn, "…"))
	}
	return dsn, true, nil
}

// isMySQLDSN reports whether s has the form of go-sql-driver/mysql's DSN:
// [user[:password]@]net(address)/dbname[?params].
func isMySQLDSN(s string) bool {
	return !strings.Contains(s, "://") && (strings.Contains(s, "@tcp(") || strings.Contains(s, "@unix(") ||
		strings.HasPrefix(s, "tcp(") || strings.HasPrefix(s, "unix("))
}

// mysqlDSNPassword returns the password of a go-sql-driver DSN, found as
// the driver finds it: between the first ':' and the last '@' before the
// last '/'.
func mysqlDSNPassword(s string) (password string, start int, ok bool) {
	slash := strings.LastIndexByte(s, '/')
	if slash < 0 {
		return "", 0, false
	}
	at := strings.LastIndexByte(s[:slash], '@')
	if at < 0 {
		return "", 0, false
	}
	colon := strings.IndexByte(s[:at], ':')
	if colon < 0 {
		return "", 0, false
	}
	return s[colon+1 : at], colon + 1, true
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
