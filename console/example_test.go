package console_test

import (
	"database/sql"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/console"
	"github.com/acemq/outbox/inbox"
)

// The console mounted in an application's own server, under /outbox/,
// for two outbox tables and a consumer's inbox, behind a token from the
// environment.
func ExampleHandler() {
	var db *sql.DB // the application's pool
	var stores []*outbox.Store
	for _, table := range []string{"orders_outbox", "billing_outbox"} {
		s, err := outbox.NewStore(db, &outbox.StoreConfig{Table: table})
		if err != nil {
			log.Fatal(err)
		}
		stores = append(stores, s)
	}
	ib, err := inbox.New(db, &inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.Handler(console.Config{
		Stores:  stores,
		Inboxes: []*inbox.Inbox{ib},
		Token:   os.Getenv("OUTBOX_CONSOLE_TOKEN"),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", h))
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	_ = srv // srv.ListenAndServe()
}
