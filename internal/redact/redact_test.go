package redact_test

import (
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/redact"
)

// Issue 47, item 7: a password holding '/', '#' or '?' makes the parsers
// quote its start ("invalid port \":ab\" after host"); Reason says what
// kind of problem it is and quotes nothing.
func TestReasonQuotesNothing(t *testing.T) {
	t.Parallel()
	const frag = "ab"
	for _, s := range []string{
		"postgres://u:" + frag + "/Sup3rS3cret@h:5432/db",
		"postgres://u:" + frag + "#Sup3rS3cret@h:5432/db",
		"postgres://u:" + frag + "?Sup3rS3cret@h:5432/db",
		"amqp://g:" + frag + "/Sup3rS3cret@h:5672/",
		"amqp://g:" + frag + "#Sup3rS3cret@h:5672/",
		"amqp://g:" + frag + "?Sup3rS3cret@h:5672/",
		"amqp://g:" + frag, // a password holding ',' split by a URL list
		"postgres://u@h/db?default_query_exec_mode=bogus&password=Sup3rS3cret",
		"host=h password=Sup3rS3cret default_query_exec_mode=" + frag,
	} {
		var errs []error
		if _, err := pgx.ParseConfig(s); err != nil {
			errs = append(errs, err)
		}
		if _, err := url.Parse(s); err != nil {
			errs = append(errs, err)
		}
		if _, err := amqp.ParseURI(s); err != nil {
			errs = append(errs, err)
		}
		require.NotEmpty(t, errs, s)
		for _, err := range errs {
			r := redact.Reason(err)
			require.NotEmpty(t, r)
			require.NotContains(t, r, frag, "%s: %v", s, err)
			require.NotContains(t, r, "Sup3r", "%s: %v", s, err)
		}
	}
	_, err := pgx.ParseConfig("postgres://u@h/db?default_query_exec_mode=bogus")
	require.Equal(t, "an invalid value of default_query_exec_mode", redact.Reason(err))
	//lint:ignore SA1007 the test needs a URL that url.Parse refuses (a raw '/' in the password)
	_, err = url.Parse("postgres://u:ab/cd@h/db")
	require.Contains(t, redact.Reason(err), "must be percent-encoded")
	require.Equal(t, "a malformed postgres:// URL", redact.Malformed("postgres://u:ab/cd@h/db"))
	require.Equal(t, "a malformed connection string", redact.Malformed("u:ab@h/db"))
}
