// Package console is an operator's console for outbox tables in the
// browser: how far behind each table is and what it published in the last
// hour, what is parked and why, what waits delayed, what the relays hold
// under their leases, which keys are blocked and what each key's queue
// holds, and the actions an operator takes (retry, discard, publish now),
// one message or in bulk by filter, each after a preview and a
// confirmation, each written to the log as an audit line.
//
// Handler returns a net/http handler to mount in an application's own
// server, under a path prefix with http.StripPrefix:
//
//	h, err := console.Handler(console.Config{Stores: stores, Token: os.Getenv("OUTBOX_CONSOLE_TOKEN")})
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", h))
//
// `outbox console` serves it on its own (127.0.0.1 unless told otherwise,
// and then only with credentials).
//
// What it promises:
//   - It reads the database only to answer a request: with no page open,
//     it adds no load. The pages do not refresh themselves.
//   - Every request is authenticated when Config has credentials (a
//     token, or a user and password: HTTP basic authentication; a token
//     is also taken as a bearer token). Without them, the handler serves
//     anyone who reaches it: mount it behind your own authentication, or
//     bind it to loopback.
//   - Every request that changes state is a POST that carries the page's
//     CSRF token, and is refused from another origin (the browser's
//     Sec-Fetch-Site and Origin headers, http.CrossOriginProtection);
//     ReadOnly refuses them all. Request bodies are bounded (64 KiB).
//   - Payloads, headers and errors are rendered escaped (html/template)
//     and payloads cut at PayloadPreviewMax bytes; no connection string
//     or credential is ever rendered.
//   - Lists page by keyset (Store.FindParked), so that a page of a table
//     of ten million rows costs what the first page costs.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
)

// PayloadPreviewMax is the most bytes of a payload a page shows.
const PayloadPreviewMax = 4096

// BulkMax is the most messages one action by filter changes; an operator
// repeats it for more.
const BulkMax = 10_000

// PageSize is the number of messages a list shows a page.
const PageSize = 50

// Config configures Handler.
type Config struct {
	// Stores are the tables the console shows, one Store each, all of
	// distinct tables (at least one).
	Stores []*outbox.Store
	// Inboxes are the consumers' inboxes whose dead letters the console
	// shows and retries (each a consumer of a table; optional).
	Inboxes []*inbox.Inbox
	// DeadLetterQueues names, by inbox (as the pages name it:
	// "CONSUMER@TABLE"), the dead-letter queue of the queue its consumer
	// consumes: the console shows how many messages wait there and
	// replays them (inbox.Replay, to the queues they were dead-lettered
	// from) after a confirmation. It needs Broker.
	DeadLetterQueues map[string]string
	// Broker opens a connection to the broker for one replay or one look
	// at a dead-letter queue; the console closes it after.
	Broker func(ctx context.Context) (*amqp.Connection, error)
	// Token, when set, is required of every request: as the password of
	// HTTP basic authentication (any user name) or as a bearer token.
	Token string
	// User and Password, when set, are required of every request by HTTP
	// basic authentication. Set both or neither.
	User, Password string
	// ReadOnly refuses every action: the pages show no buttons, and a
	// POST is refused.
	ReadOnly bool
	// Logger receives an audit line for every action (who, what, on which
	// table, how many). Nil: slog.Default().
	Logger *slog.Logger
	// RequestTimeout bounds the database's work for one request (default
	// 10 s).
	RequestTimeout time.Duration
}

//go:embed assets
var assets embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"age":     age,
	"dict":    dict,
	"list":    func(v ...string) []string { return v },
	"preview": preview,
	"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
}).ParseFS(assets, "assets/*.html"))

type console struct {
	cfg        Config
	stores     map[string]*outbox.Store
	names      []string
	inboxes    map[string]*inbox.Inbox // by inboxName
	inboxNames []string
	secret     []byte
	log        *slog.Logger
}

// Handler returns the console's handler for cfg's tables. It refuses a
// configuration that cannot work: no store, two stores of one table, a
// user without a password or a password without a user.
func Handler(cfg Config) (http.Handler, error) {
	if len(cfg.Stores) == 0 {
		return nil, errors.New("console: Config.Stores is empty: give the console at least one table's Store")
	}
	if (cfg.User == "") != (cfg.Password == "") {
		return nil, errors.New("console: Config.User and Config.Password go together: set both or neither")
	}
	if len(cfg.DeadLetterQueues) > 0 && cfg.Broker == nil {
		return nil, errors.New("console: Config.DeadLetterQueues needs Config.Broker, to reach them")
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	c := &console{cfg: cfg, stores: map[string]*outbox.Store{}, inboxes: map[string]*inbox.Inbox{}, log: cfg.Logger, secret: make([]byte, 32)}
	if c.log == nil {
		c.log = slog.Default()
	}
	for i, s := range cfg.Stores {
		if s == nil {
			return nil, fmt.Errorf("console: Config.Stores[%d] is nil", i)
		}
		if _, dup := c.stores[s.Table()]; dup {
			return nil, fmt.Errorf("console: table %s is given twice", s.Table())
		}
		c.stores[s.Table()] = s
		c.names = append(c.names, s.Table())
	}
	for i, ib := range cfg.Inboxes {
		if ib == nil {
			return nil, fmt.Errorf("console: Config.Inboxes[%d] is nil", i)
		}
		name := inboxName(ib)
		if _, dup := c.inboxes[name]; dup {
			return nil, fmt.Errorf("console: inbox %s is given twice", name)
		}
		c.inboxes[name] = ib
		c.inboxNames = append(c.inboxNames, name)
	}
	for name, q := range cfg.DeadLetterQueues {
		if c.inboxes[name] == nil {
			return nil, fmt.Errorf("console: Config.DeadLetterQueues names inbox %q, which is not among Config.Inboxes", name)
		}
		if q == "" {
			return nil, fmt.Errorf("console: Config.DeadLetterQueues gives inbox %q no queue", name)
		}
	}
	if _, err := rand.Read(c.secret); err != nil {
		return nil, fmt.Errorf("console: making the CSRF secret: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /table", c.table)
	mux.HandleFunc("GET /key", c.key)
	mux.HandleFunc("GET /held", c.held)
	mux.HandleFunc("GET /parked", c.parked)
	mux.HandleFunc("GET /delayed", c.delayed)
	mux.HandleFunc("GET /inbox", c.inboxDead)
	mux.HandleFunc("GET /confirm", c.confirm)
	mux.HandleFunc("POST /act", c.act)
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("console: its assets: %w", err)
	}
	mux.Handle("GET /style.css", http.FileServerFS(static))
	cop := http.NewCrossOriginProtection()
	return c.authenticate(securityHeaders(cop.Handler(mux))), nil
}

// HasCredentials says whether cfg requires credentials of its requests.
func (cfg Config) HasCredentials() bool { return cfg.Token != "" || cfg.User != "" }

// authenticate refuses a request without the configured credentials.
func (c *console) authenticate(next http.Handler) http.Handler {
	if !c.cfg.HasCredentials() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (c *console) authorized(r *http.Request) bool {
	eq := func(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
	if c.cfg.Token != "" {
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && eq(bearer, c.cfg.Token) {
			return true
		}
		if _, pass, ok := r.BasicAuth(); ok && eq(pass, c.cfg.Token) {
			return true
		}
	}
	if c.cfg.User != "" {
		user, pass, ok := r.BasicAuth()
		return ok && eq(user, c.cfg.User) && eq(pass, c.cfg.Password)
	}
	return false
}

// who names the requester in audit lines.
func who(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		return user + "@" + r.RemoteAddr
	}
	return r.RemoteAddr
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// csrfToken is the token of r's forms: a MAC of the requester's identity
// under this handler's secret, which another origin cannot read.
func (c *console) csrfToken(r *http.Request) string {
	user, _, _ := r.BasicAuth()
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("csrf\x00" + user))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c *console) csrfValid(r *http.Request) bool {
	return hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.csrfToken(r)))
}

// dict makes a template's map of its pairs of arguments.
func dict(kv ...any) (map[string]any, error) {
	if len(kv)%2 != 0 {
		return nil, errors.New("dict: an odd number of arguments")
	}
	m := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok {
			return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
		}
		m[k] = kv[i+1]
	}
	return m, nil
}

// inboxName names an inbox on the pages: its consumer and table.
func inboxName(ib *inbox.Inbox) string { return ib.ConsumerName() + "@" + ib.Table() }
