package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// Issue 38, item 5: outbox status and outbox parked print one JSON
// document with --json, parked's with the whole last error and the
// headers; --full prints the error whole in text; an unordered table shows
// no blocked keys (nothing can block there), an ordered one does.
func TestStatusAndParkedOutputs(t *testing.T) {
	t.Parallel()
	longError := "publish failed: " + strings.TrimSpace(strings.Repeat("exchange \"orders\" refused the message; ", 6)) + "\nsecond line: channel closed by the broker"
	for _, layout := range []string{"rows", "log"} {
		for _, ordering := range []outbox.Ordering{outbox.Unordered, outbox.OrderedByKey} {
			ordered := ordering == outbox.OrderedByKey
			name := layout + map[bool]string{true: " ordered", false: " unordered"}[ordered]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := dbtest.DB(t)
				table := dbtest.Table(t)
				store, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table, MaxAttempts: 1, Ordering: ordering, Logger: dbtest.Logger(t)})
				require.NoError(t, err)
				create := store.CreateSchemaIfAbsent
				if layout == "log" {
					create = store.CreateLogSchemaIfAbsent
				}
				require.NoError(t, create(ctx))

				code, out, errOut := outboxCmd(t, nil, "parked", "--table", table, "--json")
				require.Equal(t, 0, code, errOut)
				require.JSONEq(t, "[]", out, "no parked messages: an empty array")

				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				require.NoError(t, store.Add(ctx, tx,
					outbox.Event{Type: "order.placed", Key: "order-7", Headers: map[string]string{"tenant": "acme"}},
					outbox.Event{Type: "order.shipped", Key: "order-8"}))
				require.NoError(t, tx.Commit())
				msgs, err := store.Claim(ctx, 1, time.Minute)
				require.NoError(t, err)
				require.Len(t, msgs, 1)
				require.Equal(t, "order.placed", msgs[0].EventType)
				require.NoError(t, store.MarkFailed(ctx, msgs[0], longError))

				// status --json: one document, every count, blocked keys
				// only where keys can block.
				code, out, errOut = outboxCmd(t, nil, "status", "--table", table, "--json")
				require.Equal(t, 0, code, errOut)
				var st map[string]any
				require.NoError(t, json.Unmarshal([]byte(out), &st), "%s", out)
				require.Equal(t, table, st["table"])
				require.Equal(t, ordered, st["ordered"])
				require.EqualValues(t, 1, st["parked"], "%s", out)
				require.EqualValues(t, 0, st["claimed"], "%s", out)
				require.Contains(t, st, "pending")
				require.Contains(t, st, "oldest_pending_age_seconds")
				require.Contains(t, st, "published_last_hour")
				if ordered {
					require.EqualValues(t, 1, st["blocked_keys"], "%s", out)
				} else {
					require.NotContains(t, st, "blocked_keys", "nothing can block in an unordered table")
				}

				code, out, errOut = outboxCmd(t, nil, "status", "--table", table)
				require.Equal(t, 0, code, errOut)
				require.Regexp(t, `parked\s+1\n`, out)
				if ordered {
					require.Regexp(t, `blocked keys\s+1\n`, out)
				} else {
					require.NotContains(t, strings.ToLower(out), "blocked", "unordered table:\n%s", out)
				}

				// parked --json: the whole error, the headers, the key.
				code, out, errOut = outboxCmd(t, nil, "parked", "--table", table, "--json")
				require.Equal(t, 0, code, errOut)
				var parked []map[string]any
				require.NoError(t, json.Unmarshal([]byte(out), &parked), "%s", out)
				require.Len(t, parked, 1)
				p := parked[0]
				require.Equal(t, msgs[0].ID, p["id"])
				require.Equal(t, "order.placed", p["type"])
				require.Equal(t, "order-7", p["key"])
				require.EqualValues(t, 1, p["attempts"])
				require.Equal(t, longError, p["last_error"], "the whole error, its newline kept")
				require.Equal(t, map[string]any{"tenant": "acme"}, p["headers"])
				created, err := time.Parse(time.RFC3339Nano, p["created_at"].(string))
				require.NoError(t, err)
				require.WithinDuration(t, msgs[0].CreatedAt, created, time.Microsecond)

				// The table cuts the error short and says how to see it whole.
				code, out, errOut = outboxCmd(t, nil, "parked", "--table", table)
				require.Equal(t, 0, code, errOut)
				require.NotContains(t, out, "second line")
				require.Contains(t, out, "…")
				require.Contains(t, out, "--full prints them whole")
				if ordered {
					require.Regexp(t, `ID\s+EVENT TYPE\s+BLOCKED KEY\s+ATTEMPTS`, out)
					require.Contains(t, out, "in ordered mode each key shown is blocked")
				} else {
					require.Regexp(t, `ID\s+EVENT TYPE\s+KEY\s+ATTEMPTS`, out)
					require.NotContains(t, strings.ToLower(out), "blocked", "unordered table:\n%s", out)
				}

				// --full: every line of the error, and the headers.
				code, out, errOut = outboxCmd(t, nil, "parked", "--table", table, "--full")
				require.Equal(t, 0, code, errOut)
				first, second, _ := strings.Cut(longError, "\n")
				require.Regexp(t, `last error\s+`+regexp.QuoteMeta(first)+`\n\s+`+regexp.QuoteMeta(second)+`\n`, out)
				require.Regexp(t, `header\s+tenant: acme\n`, out)
				require.NotContains(t, out, "…")
				if !ordered {
					require.NotContains(t, strings.ToLower(out), "blocked", "unordered table:\n%s", out)
				}

				code, _, errOut = outboxCmd(t, nil, "parked", "--table", table, "--json", "--full")
				require.Equal(t, 2, code)
				require.Contains(t, errOut, "give one")
			})
		}
	}
}

// Issue 38, item 5: the text report of outbox verify gives, per fault it
// injected, how many messages were in flight then, so that "0 duplicates"
// after two kills can be read: the kills struck with messages claimed.
func TestVerifyReportPrintsInFlightPerFault(t *testing.T) {
	t.Parallel()
	n37, n0 := int64(37), int64(0)
	var out strings.Builder
	v := &verifier{c: &common{cli: &cli{stdout: &out}}}
	v.print(&verifyReport{Seconds: 12, Layout: "log", Committed: 900, Deliveries: 900,
		Faults:   map[string]int{"kill": 2, "stall": 1},
		FaultLog: []faultEvent{{Fault: "kill", At: 3.1, InFlight: &n37}, {Fault: "stall", At: 6.2, InFlight: &n0}, {Fault: "kill", At: 9.4}},
		OK:       true})
	t.Logf("\n%s", out.String())
	require.Contains(t, out.String(), "faults            kill 2, cut-db 0, cut-broker 0, stall 1\n")
	require.Regexp(t, `\n    kill\s+at\s+3\.1s  in flight 37, duplicates 0\n    stall\s+at\s+6\.2s  in flight 0, duplicates 0\n    kill\s+at\s+9\.4s  in flight unknown`, out.String())
	require.Contains(t, out.String(), "in flight: messages claimed by a relay and not yet settled")
}
