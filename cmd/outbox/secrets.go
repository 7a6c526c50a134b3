package main

import (
	"io"
	"net/url"
	"regexp"
	"strings"
	"sync"
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

// queryPassword finds the password of a URL's query (?password=...): the
// value runs to the next & or the end.
var queryPassword = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)([^&]*)`)

// dsnSecrets returns the passwords a PostgreSQL or AMQP connection string
// holds, in every form pgx and amqp091-go accept: URL userinfo, a password
// query parameter, a password= keyword; raw and decoded.
func dsnSecrets(s string) []string {
	var out []string
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
	matches := kvPassword.FindAllStringSubmatch(s, -1)
	if strings.Contains(s, "://") {
		matches = append(matches, queryPassword.FindAllStringSubmatch(s, -1)...)
	}
	for _, m := range matches {
		v := m[2]
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

// redactDSN returns a connection string fit to print: the password of
// every form replaced, or a placeholder when it cannot be parsed.
func redactDSN(s string) string {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "(the configured URL, which is malformed)"
		}
		return queryPassword.ReplaceAllString(u.Redacted(), "${1}"+redacted)
	}
	return kvPassword.ReplaceAllString(s, "${1}"+redacted)
}

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
