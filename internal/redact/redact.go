// Package redact says why a connection string was refused without quoting
// any of it. The parsers' own messages (net/url, pgx, amqp091-go) quote
// the string, or a fragment of it cut at the character they stumbled on:
// with a password holding '/', '#' or '?', that fragment is the start of
// the password ("invalid port \":ab\" after host"), which no filter of
// the whole password catches.
package redact

import (
	"regexp"
	"strings"
)

// kinds are the parsers' reasons this package recognises, in the order
// they are tried, and the words it says instead.
var kinds = []struct{ in, out string }{
	{"invalid port", "a port that is not a number (a password holding / # ? @ : or , must be percent-encoded)"},
	{"invalid URL escape", "an invalid %-escape"},
	{"invalid userinfo", "invalid characters in the user or password"},
	{"control character", "a control character"},
	{"invalid character", "an invalid character in the host"},
	{"missing protocol scheme", "no scheme"},
	{"AMQP scheme", "a scheme other than amqp:// or amqps://"},
	{"whitespace", "whitespace"},
	{"keyword/value", "a keyword/value pair that does not parse"},
	{"failed to parse as URL", "a URL that does not parse"},
}

// keyword finds pgx's "invalid default_query_exec_mode", "sslmode is
// invalid" and amqp091-go's "heartbeat is not an uint16": the setting
// named is the parser's own text, never the input's.
var keyword = regexp.MustCompile(`(?:\binvalid ([a-z_]+)\s*$|\b([a-z_]+) is invalid\b|^([a-z_]+) is not an? )`)

// Reason is the kind of err, a parser's refusal of a connection string,
// in words that quote none of the string.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, k := range kinds {
		if strings.Contains(msg, k.in) {
			return k.out
		}
	}
	// pgx: "cannot parse `…`: <reason>", the reason after the quote.
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+3:]
	}
	if m := keyword.FindStringSubmatch(msg); m != nil {
		return "an invalid value of " + m[1] + m[2] + m[3]
	}
	return "it does not parse"
}

// scheme is what may stand before "://" in a URL.
var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}://`)

// Malformed names a connection string that does not parse, without any of
// it but its scheme: "a malformed postgres:// URL".
func Malformed(s string) string {
	if m := scheme.FindString(s); m != "" {
		return "a malformed " + strings.ToLower(m) + " URL"
	}
	return "a malformed connection string"
}
