package main

import (
	"io"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"github.com/acemq/outbox/internal/redact"
)

// redacted replaces a secret wherever it would be printed.
const redacted = "xxxxx"

// secretMin is the shortest secret the output filter replaces: shorter
// strings would garble ordinary text. Such a password is still kept out of
// every message the CLI composes (they print URLs redacted); only a
// third-party message quoting it verbatim would slip through.
const secretMin = 3

// kvPassword finds the password of a keyword/value connection string
// (password=..., quoted or not): the value runs to the next whitespace
// whatever it holds (libpq's own rule: "ab;cd" is one value), and a quote
// left open runs to the end of the string.
var kvPassword = regexp.MustCompile(`(?i)((?:^|\s)(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|'.*$|\S*)`)

// dsnSecrets returns the passwords a PostgreSQL or AMQP connection string
// holds, in every form pgx and amqp091-go accept: URL userinfo, a password
// query parameter, a password= keyword; raw and decoded.
func dsnSecrets(s string) []string {
	var out []string
	if isMySQLDSN(s) {
		if p, _, ok := mysqlDSNPassword(s); ok {
			out = append(out, p)
		}
	}
	if i := strings.Index(s, "://"); i >= 0 {
		if j := strings.LastIndex(s, "@"); j > i {
			if k := strings.Index(s[i+3:j], ":"); k >= 0 {
				out = append(out, s[i+3+k+1:j])
			}
		}
		if u, err := url.Parse(s); err == nil {
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
	}
	values := queryPasswords(s)
	for _, m := range kvPassword.FindAllStringSubmatch(s, -1) {
		values = append(values, m[2])
	}
	for _, v := range values {
		out = append(out, v)
		if uq, err := url.QueryUnescape(v); err == nil {
			out = append(out, uq)
		}
		if len(v) >= 2 && v[0] == '\'' {
			out = append(out, strings.ReplaceAll(strings.ReplaceAll(v[1:len(v)-1], `\'`, `'`), `\\`, `\`))
		}
	}
	return out
}

// queryPasswords returns the raw values of the password parameters of a
// URL's query, whatever the URL's other parts hold (it may not parse):
// pgx decodes the parameters' names, so ?pass%77ord=… is a password.
func queryPasswords(s string) []string {
	i := strings.Index(s, "://")
	if i < 0 {
		return nil
	}
	q := strings.IndexByte(s[i:], '?')
	if q < 0 {
		return nil
	}
	var out []string
	for _, kv := range strings.Split(s[i+q+1:], "&") {
		k, v, _ := strings.Cut(kv, "=")
		if passwordParam(k) {
			out = append(out, v) // "ab#cd": the password meant, and what pgx takes
			if before, _, ok := strings.Cut(v, "#"); ok {
				out = append(out, before)
			}
		}
	}
	return out
}

// passwordParam reports whether a URL query parameter's raw name is
// password or sslpassword, once decoded.
func passwordParam(raw string) bool {
	k, err := url.QueryUnescape(raw)
	if err != nil {
		k = raw
	}
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword")
}

// redactDSN returns a connection string fit to print: the password of
// every form replaced, or a placeholder naming only its scheme when it
// cannot be parsed (the parts of a malformed URL cannot be told apart: a
// password holding a '/' looks like a host and a path).
func redactDSN(s string) string {
	if isMySQLDSN(s) {
		if p, start, ok := mysqlDSNPassword(s); ok && p != "" {
			return s[:start] + redacted + s[start+len(p):]
		}
		return s
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return redact.Malformed(s)
		}
		if u.RawQuery != "" {
			kvs := strings.Split(u.RawQuery, "&")
			for i, kv := range kvs {
				if k, _, _ := strings.Cut(kv, "="); passwordParam(k) {
					kvs[i] = k + "=" + redacted
				}
			}
			u.RawQuery = strings.Join(kvs, "&")
		}
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(s, "${1}"+redacted)
}

// looksLikeDSN reports whether s, given where a table name or a message
// id goes, is a connection string, which must not be echoed.
func looksLikeDSN(s string) bool {
	return strings.Contains(s, "://") || isMySQLDSN(s) || kvPassword.MatchString(s) || kvKeyword.MatchString(s)
}

// kvKeyword finds a keyword of a keyword/value connection string.
var kvKeyword = regexp.MustCompile(`(?i)(?:^|\s)(?:host|hostaddr|port|user|dbname|sslmode)\s*=`)

// secrets collects the secrets of a CLI run and filters them out of its
// output, whatever prints it: the CLI, slog, or a driver's error passed on.
type secrets struct {
	mu   sync.Mutex
	list []string
}

func (s *secrets) addDSN(dsns ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range dsns {
		for _, p := range dsnSecrets(d) {
			if len(p) >= secretMin && p != redacted {
				s.list = append(s.list, p)
			}
		}
	}
}

// add adds secrets given whole (a token, a password), those long enough
// to be told from ordinary text.
func (s *secrets) add(secrets ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range secrets {
		if len(p) >= secretMin {
			s.list = append(s.list, p)
		}
	}
}

func (s *secrets) scrub(text string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.list {
		text = strings.ReplaceAll(text, p, redacted)
	}
	return text
}

// writer returns w with every secret replaced.
func (s *secrets) writer(w io.Writer) io.Writer { return scrubWriter{w, s} }

type scrubWriter struct {
	w io.Writer
	s *secrets
}

func (sw scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.s.scrub(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
