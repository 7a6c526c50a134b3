package outbox

import (
	"cmp"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/acemq/outbox/internal/dbpool"
	"github.com/acemq/outbox/internal/dialect"
	"github.com/acemq/outbox/internal/pgrows"
)

// Defaults and limits of StoreConfig.
const (
	// MaxAttemptsDefault is how many failed attempts park a message unless
	// StoreConfig.MaxAttempts says otherwise.
	MaxAttemptsDefault = 10

	// PurgeBatchSizeDefault is how many rows one purge statement deletes.
	PurgeBatchSizeDefault = 5000

	// BatchMaxBytesDefault bounds the payloads and headers one Claim
	// returns, unless StoreConfig.BatchMaxBytes says otherwise.
	BatchMaxBytesDefault = 64 << 20

	// insertChunk is the most rows one INSERT carries. Larger writes are
	// split into several statements, still in the caller's transaction; the
	// SQL text of each row count is built once and reused.
	insertChunk = 100

	// lastErrorMax bounds the reason stored by MarkFailed, in bytes.
	lastErrorMax = 2000
)

// BackoffFunc returns how long a message waits after its n-th failed attempt
// (n ≥ 1) before it may be claimed again.
type BackoffFunc func(attempt int) time.Duration

// ExponentialBackoff returns a BackoffFunc that doubles from base with every
// attempt up to limit, each delay picked at random between half and all of
// its nominal value, so that messages that failed together do not all come
// back together.
func ExponentialBackoff(base, limit time.Duration) BackoffFunc {
	return func(attempt int) time.Duration {
		d := limit
		if attempt < 1 {
			attempt = 1
		}
		if attempt < 40 {
			if n := base << (attempt - 1); n > 0 && n < limit {
				d = n
			}
		}
		if d <= 1 {
			return d
		}
		return d/2 + rand.N(d/2+1)
	}
}

// Ordering is the order in which a Store hands messages to relays.
type Ordering int

const (
	// Unordered, the default, claims messages in the order they were
	// written but lets relays publish them side by side, and a message
	// that fails waits out its backoff while later ones go ahead: most
	// messages arrive in order, none waits for another.
	Unordered Ordering = iota

	// OrderedByKey keeps the order of the messages of each key: for two
	// messages with the same non-empty Event.Key, where m1 was written
	// first, the first delivery of m2 never comes before the first delivery
	// of m1 (to a queue consumed in order). The order is a property of the
	// table (an ordered table, see OrderSchema and Store.ConvertOrdering),
	// kept whatever writes to it. See the package documentation for what
	// "written first" means and what it costs.
	OrderedByKey
)

// String returns "unordered" or "ordered by key".
func (o Ordering) String() string {
	switch o {
	case Unordered:
		return "unordered"
	case OrderedByKey:
		return "ordered by key"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// StoreConfig configures a Store. The zero value (and nil) gives the defaults.
type StoreConfig struct {
	// Backoff decides how long a failed message waits before it is tried
	// again. Defaults to ExponentialBackoff(time.Second, 10*time.Minute).
	Backoff BackoffFunc

	// BatchMaxBytes bounds the bytes of payloads and headers one Claim
	// returns, so that a relay's memory is bounded by bytes as well as by
	// rows: a claim of 100 messages of 10 MB each would otherwise bring
	// 1 GB into memory at once. A claim always returns at least one
	// message, however large. Defaults to 64 MiB.
	BatchMaxBytes int64

	// Database is the database the table is in, for a Store that cannot
	// tell from its pool: one made with NewStore(nil, …) to write only,
	// as the ORM plugins make it. A Store with a pool speaks the database
	// of the pool's driver (go-sql-driver/mysql's: MySQL), and a Database
	// that says otherwise is an error. Defaults to PostgreSQL.
	Database Database

	// Headers adds headers to every written event, taken from the writer's
	// context (trace context, tenant, …). Defaults to none.
	Headers HeaderFunc

	// Logger receives the store's warnings (lost leases, parked messages).
	// Defaults to slog.Default().
	Logger *slog.Logger

	// MaxAttempts is how many failed attempts park a message: it is then
	// never claimed again until an operator retries it. Defaults to 10.
	MaxAttempts int

	// Ordering is Unordered (the default) or OrderedByKey: what this
	// program expects of the table. The order itself is the table's (see
	// OrderedByKey): on an ordered table every writer takes each key's
	// turn and every relay claims in order, whatever its Store says. A
	// Store set to OrderedByKey makes its table ordered in
	// CreateSchemaIfAbsent, takes its keys in one statement before it
	// writes, and its relays refuse to run on a table that is not ordered
	// (outbox.ErrOrderingUnsafe) rather than publish without the order.
	Ordering Ordering

	// PurgeBatchSize is how many rows one statement of PurgePublished deletes,
	// keeping each statement (and its locks and WAL) small. Defaults to 5000.
	PurgeBatchSize int

	// Router chooses exchange and routing key for events that do not set
	// their own. Defaults to ToExchange(""): the broker's default exchange,
	// routing key = event type.
	Router Router

	// Table is the outbox table, optionally schema-qualified
	// ("billing.outbox"). Lowercase letters, digits and underscores only.
	// Defaults to "outbox".
	Table string
}

// Store is an outbox kept in a table of PostgreSQL, MySQL or MariaDB (see
// Database), in the same database as the data whose changes it announces.
//
// A Store has two sources of connections, on purpose. Add writes through the
// transaction the caller passes in and nothing else, so an event commits or
// rolls back with the change it describes. Everything the relay does —
// claiming, marking, counting, purging — runs on the Store's own pool, in
// short statements of its own, and never holds a transaction open while a
// message travels to the broker.
//
// A Store is safe for concurrent use.
type Store struct {
	db            *sql.DB
	t             table
	backoff       BackoffFunc
	headers       HeaderFunc
	logger        *slog.Logger
	maxAttempts   int
	purgeBatch    int
	batchMaxBytes int64
	router        Router
	newID         func() (uuid.UUID, error) // uuid.NewV7; tests skew its clock

	database Database
	st       storage   // the database's: PostgreSQL's, or a backend's (see storage)
	sched    scheduler // its delayed messages' statements

	schedAbsentUntil atomic.Int64  // unix ns: the table had no scheduled table lately; MoveDue and Maintain look again after it
	lookAt           atomic.Int64  // unix ns: MoveDue makes no statement before it
	nextDueAt        atomic.Int64  // unix ns: when the next delayed message MoveDue knows of is due; 0: none
	moverAt          atomic.Int64  // unix ns: the last call of MoveDue
	dueLook          time.Duration // MoveDue looks again this long after a look (dueLook; tests lengthen it)

	readOnly dbpool.Leaver // drops the pool's connections to a server that accepts no writes

	order   orderMode // the order claims keep: configured, and as last read of the table
	pgState           // on PostgreSQL
}

// NewStore returns a Store on the table that cfg names. db is the relay's own
// pool: it is never used by Add. It may be nil for a Store that only writes
// (as the ORM plugins do); the relay-side methods then return ErrNoPool.
// NewStore does not touch the database. The store speaks the database of
// db's driver (go-sql-driver/mysql's: MySQL; any other: PostgreSQL), or,
// without a pool, StoreConfig.Database's. It refuses, with an error
// wrapping ErrUnsupportedDatabase, a db whose driver is known to be
// another database's (SQLite's, SQL Server's).
func NewStore(db *sql.DB, cfg *StoreConfig) (*Store, error) {
	if cfg == nil {
		cfg = &StoreConfig{}
	}
	var spoken string
	if db != nil {
		var err error
		if spoken, err = dialect.Check("outbox: NewStore", "the *sql.DB's driver speaks", dialect.OfDriver(db.Driver())); err != nil {
			return nil, err
		}
	}
	database, err := chooseDatabase(db, cfg.Database, spoken)
	if err != nil {
		return nil, err
	}
	t, err := parseTable(cmp.Or(cfg.Table, TableDefault))
	if err != nil {
		return nil, err
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("outbox: StoreConfig.MaxAttempts must not be negative (got %d)", cfg.MaxAttempts)
	}
	if cfg.BatchMaxBytes < 0 {
		return nil, fmt.Errorf("outbox: StoreConfig.BatchMaxBytes must not be negative (got %d)", cfg.BatchMaxBytes)
	}
	if cfg.Ordering != Unordered && cfg.Ordering != OrderedByKey {
		return nil, fmt.Errorf("outbox: StoreConfig.Ordering must be Unordered or OrderedByKey (got %d)", int(cfg.Ordering))
	}
	if cfg.PurgeBatchSize < 0 {
		return nil, fmt.Errorf("outbox: StoreConfig.PurgeBatchSize must not be negative (got %d)", cfg.PurgeBatchSize)
	}
	s := &Store{
		db:            db,
		t:             t,
		backoff:       cfg.Backoff,
		headers:       cfg.Headers,
		logger:        cfg.Logger,
		maxAttempts:   cmp.Or(cfg.MaxAttempts, MaxAttemptsDefault),
		purgeBatch:    cmp.Or(cfg.PurgeBatchSize, PurgeBatchSizeDefault),
		batchMaxBytes: cmp.Or(cfg.BatchMaxBytes, BatchMaxBytesDefault),
		router:        cfg.Router,
		newID:         uuid.NewV7,
		dueLook:       dueLook,
		database:      database,
	}
	s.order.configured = cfg.Ordering
	if be := newBackend(database, t); be != nil {
		s.st, s.sched = backendStorage{backendOps{queueOps{s, be}, be}}, backendScheduler{be}
	} else {
		s.st, s.sched = pgStorage{s}, newPGScheduler(t)
		s.rows = pgrows.New(pgrows.Table{Quoted: t.quoted, OrderedNow: t.orderedNow()})
		s.turns = newKeyTurns()
	}
	if s.backoff == nil {
		s.backoff = ExponentialBackoff(time.Second, 10*time.Minute)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if s.router == nil {
		s.router = ToExchange("")
	}
	return s, nil
}

// Table returns the table name the store works on, as configured.
func (s *Store) Table() string { return s.t.full }

// MaxAttempts returns how many failed attempts park a message.
func (s *Store) MaxAttempts() int { return s.maxAttempts }
