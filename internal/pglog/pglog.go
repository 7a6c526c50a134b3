// Package pglog keeps the queue of an outbox table of PostgreSQL's log
// layout (outbox.LayoutLog): events are only ever inserted, and what
// relays took, published or failed is recorded in small tables beside
// them (batches, settles, failures). It implements backend.Queue;
// package outbox's Store dispatches to it when the table it opens has
// that layout, and keeps what the two PostgreSQL layouts share (the
// tables' DDL and its claim function, the order trigger and the writers'
// key turns, the delayed messages beside it, the check of the layout's
// objects, the conversions).
//
// A claim takes the next part of a window of transactions (the table's
// claim function, under the table's claim lock) and records it as a
// batch; its messages are settled by inserting into the settle table,
// fenced by the batch's generation and the claim's token (ownBatch). A
// batch whose lease ran out, or that was released, is taken over under
// its next generation. A message that fails is copied to the failed
// table, where it backs off and parks; on an ordered table the later
// messages of its key wait there behind it.
//
// Who does what: claims run on the relay's claiming goroutine; Maintain
// (every 100ms from the relay's upkeep goroutine) makes the looks for
// batches to take over and failed messages due again, and the rotation
// of the partitions, leaving what a look found to the next claim (see
// looks.go). A Backend's state (the low-water mark of unfinished batches,
// the schedule of looks and rotations) is guarded by its mutex.
package pglog

import (
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/backend"
)

// BatchParts is the number of partitions of the batch and settle tables.
const BatchParts = 4

// Table names a table of the log layout and the objects beside it, all
// quoted and qualified as configured.
type Table struct {
	Quoted, Full string // the events table, quoted; its name as configured, for messages
	// OrderedNow is a condition, evaluated once per statement, that holds
	// while the table is ordered (its order trigger is enabled).
	OrderedNow                                 string
	Batch, Settle, Failed, Seq, ClaimFn        string
	LockKey                                    string // the key of the claim lock (an advisory lock)
	Chunk, Parts, BatchChunk                   int64  // seq numbers a partition holds at a time; partitions; batch ids of a batch partition
	Partition, BatchPartition, SettlePartition func(i int64) string
}

// Config is what a Backend is given beside its table.
type Config struct {
	// Logger receives what the backend does on its own (rotation
	// failures, claims given back).
	Logger *slog.Logger
	// Unfit says why headers as stored cannot be relayed ("" when they
	// can): a claim parks such a message instead of returning it.
	Unfit func(id string, headers []byte) string
}

// Backend is the queue of one table of the log layout. It is safe for
// concurrent use.
type Backend struct {
	t   Table
	cfg Config
	q   statements

	mu  sync.Mutex
	low int64 // no batch below it is unfinished, as far as this backend has seen
	// server is when the server that low was learnt from started
	// (pg_postmaster_start_time): a failover, or a restart, brings a
	// server whose batch table may have lost what low was learnt from.
	server string
	looks
	rot rotated
	now func() time.Time
}

var (
	_ backend.Queue      = (*Backend)(nil)
	_ backend.GiveBacker = (*Backend)(nil)
)

// New returns the Backend of t, its statements built.
func New(t Table, cfg Config) *Backend {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Unfit == nil {
		cfg.Unfit = func(string, []byte) string { return "" }
	}
	return &Backend{t: t, cfg: cfg, q: newStatements(t), looks: looks{lookEvery: lookEvery}, now: time.Now}
}

// Inherit starts b where old's low-water mark is: the table was read again
// (a statement found it changed), and its batches below the mark are
// finished still (unfinished starts again from 0 by itself if the table was
// emptied).
func (b *Backend) Inherit(old *Backend) {
	if old == nil {
		return
	}
	old.mu.Lock()
	low := old.low
	old.mu.Unlock()
	b.mu.Lock()
	b.low = low
	b.mu.Unlock()
}

// BatchClaim is the claim of the messages taken in a batch: the batch, its
// generation (a take-over claims it again under the next) and the claim's
// token, written in the batch's row (see ownBatch). Ordered says that the
// claim function found the table ordered.
type BatchClaim struct {
	Batch   int64
	Gen     int
	Token   uuid.UUID
	Ordered bool
}

// FailedClaim is the claim token written in the failed table's rows it
// took.
type FailedClaim uuid.UUID

// Backend implements backend.Claim.
func (BatchClaim) Backend() string  { return "postgres-log" }
func (FailedClaim) Backend() string { return "postgres-log" }

// FoundOrdered says whether the claim found its table ordered (see
// backend.OrderFinder).
func (c BatchClaim) FoundOrdered() bool { return c.Ordered }
