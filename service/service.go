// Package service runs a service's half of the outbox in-process, in one
// call: the relay that publishes its outbox table to RabbitMQ, and the inbox
// consumers that apply what it receives, until a context ends.
//
// It is the wiring a service would otherwise write itself (a Store, an
// AMQPPublisher, relay.New, inbox.New, one Consumer per queue, a goroutine
// each, shutdown in order) with the defaults `outbox relay` uses. Nothing in
// it is needed for the promise: a relay run by `outbox relay` in a process
// of its own, or by package relay, keeps the same one.
//
//	sqlDB, _ := gdb.DB() // GORM; with ent, the *sql.DB the client was opened on
//	svc, err := service.New(&service.Config{
//		DB:        sqlDB,
//		AMQPURLs:  []string{os.Getenv("AMQP_URL")},
//		Inbox:     &inbox.Config{Consumer: "billing"},
//		Consumers: []*inbox.ConsumerConfig{{Queue: "billing", Handler: bill}},
//	})
//	if err != nil { … }
//	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	return svc.Run(ctx)
//
// Run returns nil when its context ends and everything has stopped: the
// relay has had its ShutdownTimeout to settle what it published and has
// released what it could not, and each consumer has finished the delivery
// it was handling. When a part stops with an error nothing can repair (an
// outbox table that is not one, a closed *sql.DB), the others are stopped
// too and Run returns that error.
//
// The relay and the consumers use connections of DB's pool: the relay up to
// MaxInFlight + 2 at once (claims, settles, bookkeeping), each consumer one
// per delivery it is handling. Size the pool for them beside the
// application's own use (database/sql keeps only 2 idle connections unless
// told otherwise: SetMaxIdleConns).
package service

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/inbox"
	"github.com/acemq/outbox/relay"
)

// Config configures a Service. DB is required, and a relay, a consumer or
// both.
type Config struct {
	// DB is the service's database: the relay claims from the outbox
	// table on it, and each consumer applies its messages in
	// transactions on it. From GORM, gorm.DB's DB(); from ent, the
	// *sql.DB the client's driver was opened on.
	DB *sql.DB

	// AMQPURLs are the broker's nodes, for the relay and, unless a
	// ConsumerConfig gives its own, the consumers. Defaults to
	// amqp://guest:guest@localhost:5672/.
	AMQPURLs []string

	// Table is the outbox table the relay publishes (the table the
	// service's writers write: gormoutbox.Plugin's Table, entoutbox's,
	// StoreConfig.Table). Defaults to outbox.TableDefault. Ignored with
	// NoRelay.
	Table string

	// NoRelay runs no relay: the service only consumes (its outbox, if
	// any, is relayed elsewhere, for example by `outbox relay`).
	NoRelay bool

	// Store, Relay and Publisher tune the relay: the outbox.StoreConfig
	// (its Table and Logger are the service's), the relay.Config (its
	// Logger is the service's) and the relay.AMQPConfig (its URLs and
	// Logger are the service's). Nil: the defaults, which are those of
	// `outbox relay`.
	Store     *outbox.StoreConfig
	Relay     *relay.Config
	Publisher *relay.AMQPConfig

	// Inbox configures the inbox the consumers deduplicate with; its
	// Consumer name is required when Consumers is not empty.
	Inbox *inbox.Config

	// Consumers are the queues to consume through the inbox, one
	// consumer each. A ConsumerConfig without URLs uses AMQPURLs.
	Consumers []*inbox.ConsumerConfig

	// Logger receives the logs of every part. Defaults to slog.Default().
	Logger *slog.Logger
}

// Service is a service's relay and inbox consumers, built by New and run by
// Run.
type Service struct {
	relay     *relay.Relay
	pub       *relay.AMQPPublisher
	consumers []*inbox.Consumer
	running   atomic.Bool
}

// New checks cfg and builds the parts. It connects to nothing: the relay
// and the consumers connect when Run starts them, and retry, backing off,
// while a server is down.
func New(cfg *Config) (*Service, error) {
	if cfg == nil || cfg.DB == nil {
		return nil, errors.New("service: Config.DB is required")
	}
	if cfg.NoRelay && len(cfg.Consumers) == 0 {
		return nil, errors.New("service: nothing to run: Config.NoRelay and no Consumers")
	}
	logger := cmp.Or(cfg.Logger, slog.Default())
	s := &Service{}
	if !cfg.NoRelay {
		if err := s.newRelay(cfg, logger); err != nil {
			return nil, err
		}
	}
	if len(cfg.Consumers) > 0 {
		icfg := inbox.Config{}
		if cfg.Inbox != nil {
			icfg = *cfg.Inbox
		}
		icfg.Logger = cmp.Or(icfg.Logger, logger)
		ib, err := inbox.New(cfg.DB, &icfg)
		if err != nil {
			return nil, fmt.Errorf("service: %w", err)
		}
		for i, ccfg := range cfg.Consumers {
			if ccfg == nil {
				return nil, fmt.Errorf("service: Config.Consumers[%d] is nil", i)
			}
			c := *ccfg
			if len(c.URLs) == 0 {
				c.URLs = cfg.AMQPURLs
			}
			consumer, err := ib.Consumer(&c)
			if err != nil {
				return nil, fmt.Errorf("service: Config.Consumers[%d]: %w", i, err)
			}
			s.consumers = append(s.consumers, consumer)
		}
	}
	return s, nil
}

// newRelay builds the relay and its publisher.
func (s *Service) newRelay(cfg *Config, logger *slog.Logger) error {
	scfg, rcfg, pcfg := outbox.StoreConfig{}, relay.Config{}, relay.AMQPConfig{}
	if cfg.Store != nil {
		scfg = *cfg.Store
	}
	if cfg.Relay != nil {
		rcfg = *cfg.Relay
	}
	if cfg.Publisher != nil {
		pcfg = *cfg.Publisher
	}
	scfg.Table, scfg.Logger = cmp.Or(cfg.Table, outbox.TableDefault), logger
	rcfg.Logger, pcfg.Logger = logger, logger
	pcfg.URL, pcfg.URLs = "", cfg.AMQPURLs
	store, err := outbox.NewStore(cfg.DB, &scfg)
	if err != nil {
		return fmt.Errorf("service: %w", err)
	}
	pub, err := relay.NewAMQPPublisher(&pcfg)
	if err != nil {
		return fmt.Errorf("service: %w", err)
	}
	r, err := relay.New(store, pub, &rcfg)
	if err != nil {
		_ = pub.Close()
		return fmt.Errorf("service: %w", err)
	}
	s.relay, s.pub = r, pub
	return nil
}

// Run runs the relay and the consumers until ctx ends, then stops them and
// returns nil; or, when one of them stops with an error, stops the others
// and returns it. A Service runs once.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("service: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	run := func(f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		})
	}
	if s.relay != nil {
		run(s.relay.Run)
	}
	for _, c := range s.consumers {
		run(c.Run)
	}
	wg.Wait()
	if s.pub != nil {
		_ = s.pub.Close()
	}
	return first
}

// Relay returns the service's relay, for its Stats and Health; nil with
// Config.NoRelay.
func (s *Service) Relay() *relay.Relay { return s.relay }

// Consumers returns the service's consumers, in the order of
// Config.Consumers, for their Stats.
func (s *Service) Consumers() []*inbox.Consumer { return s.consumers }
