package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/acemq/outbox/internal/pgerr"
	"github.com/acemq/outbox/internal/pglog"
	"github.com/acemq/outbox/internal/pgsql"
)

// Layout is how an outbox table keeps its messages. It is a property of the
// table, recorded in the database when the table is created: every Store on
// the table finds it there, and no configuration chooses it.
type Layout int

const (
	// LayoutRows keeps one row per message and updates it as the message is
	// claimed, published, failed or parked. It is what RowsSchema,
	// Store.CreateRowsSchemaIfAbsent, the migrations under rows/ of
	// Migrations and `outbox schema --layout rows` create.
	LayoutRows Layout = iota + 1

	// LayoutLog only ever inserts events: what relays took, published or
	// failed is recorded in small tables beside it (batches, settles,
	// failures), and history goes away by truncating whole partitions,
	// never by DELETE or UPDATE. Relaying leaves no dead tuples in the
	// table that holds the events, so claims do not slow down while
	// VACUUM is held back (by a long report query, say). It is the
	// default: what Schema (LogSchema), Store.CreateSchemaIfAbsent, the
	// top of Migrations and `outbox schema` create; made ordered by
	// Store.ConvertOrdering (`outbox convert --to ordered`) or created so
	// (`outbox schema --layout log --ordered`), like a table of LayoutRows.
	LayoutLog
)

// String returns "rows" or "log".
func (l Layout) String() string {
	switch l {
	case LayoutRows:
		return "rows"
	case LayoutLog:
		return "log"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// Log layout sizes: the events table has logParts partitions, each holding
// logChunk consecutive seq numbers at a time, in rotation; the batch and
// settle tables have logParts partitions of logBatchChunk batch ids.
const (
	logChunkDefault      = 1_000_000
	logPartsDefault      = 16
	logBatchChunkDefault = 1024
	logBatchParts        = pglog.BatchParts
	logVersion           = 2
	// logClaimRevision marks the claim function this version of the
	// library creates (a comment on it): a table whose function is older
	// works as well, at a higher cost per claim, until `outbox schema
	// --layout log --apply` replaces the function. Revision 2 leaves out
	// the scan of the transactions running at the window's start when
	// there were none; functions without the mark are older.
	logClaimRevision = 2
)

// logClaimArgs are the claim function's argument types, to name it.
const logClaimArgs = "(integer, bigint, bigint, uuid, bigint)"

// logClaimMark is the comment that marks a claim function's revision.
const logClaimMark = "outbox claim revision "

// logTables names the objects of a table of LayoutLog.
type logTables struct {
	meta, batch, settle, failed, seq, ordSeq, view, claimFn string // quoted, qualified
	chunk, parts, batchChunk                                int64
}

func (t table) logTables() logTables {
	return logTables{
		meta: t.qualified(t.name + "_log"), batch: t.qualified(t.name + "_batch"), settle: t.qualified(t.name + "_settle"),
		failed: t.qualified(t.name + "_failed"), seq: t.qualified(t.name + "_seq"), ordSeq: t.qualified(t.name + "_ord_seq"),
		view:    t.qualified(t.name + "_messages"),
		claimFn: t.qualified(t.name + "_claim"),
		chunk:   logChunkDefault, parts: logPartsDefault, batchChunk: logBatchChunkDefault,
	}
}

// LogSchema returns the DDL that creates an outbox table of LayoutLog: the
// events table, partitioned in rotation by seq; the batch and settle
// tables, where relays record what they took and what became of it; the
// failed table, which keeps a copy of every message that failed, with its
// attempts, until it is published or discarded; and the table that marks
// the layout. Every statement is idempotent.
func LogSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.logSQL(t.logTables()) + "\n" + t.scheduledSQL(), nil
}

func (t table) logSQL(l logTables) string {
	var parts, bparts, uniq strings.Builder
	for i := int64(0); i < l.parts; i++ {
		part := t.logPartition(i)
		fmt.Fprintf(&parts, "CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (%d);\n", part, t.quoted, i)
		fmt.Fprintf(&uniq, "CREATE UNIQUE INDEX IF NOT EXISTS \"%s_p%02d_id_key\" ON %s (id);\n", t.name, i, part)
	}
	for i := int64(0); i < logBatchParts; i++ {
		fmt.Fprintf(&bparts, "CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (%d);\n", t.logBatchPartition(i), l.batch, i)
		fmt.Fprintf(&bparts, "CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (%d);\n", t.logSettlePartition(i), l.settle, i)
	}
	// The claim function's two queries first: their placeholders are
	// filled with the rest.
	claim := func(window string) string {
		q := strings.ReplaceAll(logClaimWindow, "{window}", strings.ReplaceAll(window, "\n", "\n    "))
		return strings.ReplaceAll(q, "\n", "\n        ")
	}
	ddl := strings.NewReplacer("{claimafter}", claim(logClaimAfter),
		"{claimboth}", claim(logClaimRunning+"\nUNION ALL\n"+logClaimAfter)).Replace(logDDL)
	return t.logReplacer(l, "{partitions}", parts.String(), "{bpartitions}", bparts.String(), "{uniqueids}", uniq.String()).Replace(ddl)
}

// logReplacer fills the placeholders of the log layout's statements.
func (t table) logReplacer(l logTables, more ...string) *strings.Replacer {
	lit := func(s string) string { return strings.ReplaceAll(s, "'", "''") }
	return strings.NewReplacer(append([]string{"{table}", t.quoted, "{name}", t.name, "{seq}", l.seq, "{seqname}", lit(l.seq),
		"{ordseq}", l.ordSeq, "{ordseqname}", lit(l.ordSeq), "{trigger}", `"` + t.orderTrigger() + `"`, "{triggerfn}", t.qualified(t.orderTrigger()),
		"{meta}", l.meta, "{view}", l.view, "{claimfn}", l.claimFn, "{lockkey}", lit(l.lockKey()), "{batch}", l.batch, "{settle}", l.settle, "{failed}", l.failed,
		"{chunk}", fmt.Sprint(l.chunk), "{parts}", fmt.Sprint(l.parts), "{bchunk}", fmt.Sprint(l.batchChunk), "{bparts}", fmt.Sprint(logBatchParts),
		"{version}", fmt.Sprint(logVersion), "{ordered}", t.orderedNow(),
		"{claimmark}", lit(logClaimMark + fmt.Sprint(logClaimRevision)), "{claimargs}", logClaimArgs,
		"{inflight}", strings.NewReplacer("{batch}", l.batch, "{settle}", l.settle).Replace(pglog.InflightCTE("low", "0")),
		"{aftercursor}", pglog.AfterCursor("a_tx", "a_seq", "pg_snapshot_xmax(lo)"), "{asynccommit}", pgsql.AsyncCommit,
		"{turn}", t.keyTurn("'"+lit(t.full)+"'", "NEW.event_key"),
		"{idindex}", t.qualified(t.name + "_id_idx"), "{idcheck}", `"` + t.idCheck() + `"`, "{idcheckname}", t.idCheck(), "{idcheckfn}", t.qualified(t.idCheck()),
		"{tablename}", lit(t.full), "{tablelit}", lit(t.quoted), "{batchlit}", lit(l.batch)}, more...)...)
}

// idCheck names the trigger (and its function) that refuses an event id
// already in another partition of a table of the log layout.
func (t table) idCheck() string { return t.name + "_id_check" }

// logDDL creates a table of the log layout, or brings one of version 1 to
// the current version (the ord columns, the boundary of ordered mode and
// the claim function that knows them).
const logDDL = `-- An outbox table of the log layout: events are only ever inserted.
CREATE SEQUENCE IF NOT EXISTS {seq};
-- ord numbers the rows of an ordered table in the order their writers took
-- their key's turn (see the order trigger): NULL on an unordered table.
CREATE SEQUENCE IF NOT EXISTS {ordseq} CACHE 1;

-- tx is the writing transaction's id: relays take what became visible
-- between two snapshots, so a transaction that commits late is never
-- skipped, whatever seq it drew. The partition of a row is its chunk of
-- {chunk} seq numbers, in rotation over {parts} partitions: history goes
-- away by TRUNCATE of a partition every message of which is settled.
CREATE TABLE IF NOT EXISTS {table} (
    id           uuid        NOT NULL,
    seq          bigint      NOT NULL DEFAULT nextval('{seqname}'),
    tx           xid8        NOT NULL DEFAULT pg_current_xact_id(),
    event_type   text        NOT NULL,
    event_key    text        NOT NULL DEFAULT '',
    exchange     text        NOT NULL DEFAULT '',
    routing_key  text        NOT NULL DEFAULT '',
    payload      bytea       NOT NULL,
    content_type text        NOT NULL DEFAULT 'application/json',
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    ord          bigint
) PARTITION BY LIST (((seq / {chunk}) % {parts}));
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS ord bigint;
ALTER SEQUENCE {seq} OWNED BY {table}.seq;
ALTER SEQUENCE {ordseq} OWNED BY {table}.ord;
{partitions}
-- Relays read the events of a window of transactions in this order.
CREATE INDEX IF NOT EXISTS "{name}_tx_idx" ON {table} (tx, seq);
-- An event's id is unique in the table (ErrDuplicateID): PostgreSQL
-- cannot index a partitioned table uniquely on a column that is not its
-- partition key, so each partition has a unique index on id (which
-- operators find messages by), and the trigger below looks in the others.
{uniqueids}DROP INDEX IF EXISTS {idindex};
CREATE OR REPLACE FUNCTION {idcheckfn}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    dup uuid;
BEGIN
    SELECT n.id INTO dup FROM outbox_new AS n
    WHERE EXISTS (SELECT 1 FROM {table} AS o WHERE o.id = n.id AND o.seq <> n.seq) LIMIT 1;
    IF FOUND THEN
        RAISE unique_violation USING MESSAGE = format('event id %s is already in table %s', dup, '{tablename}'),
            DETAIL = format('Key (id)=(%s) already exists.', dup);
    END IF;
    RETURN NULL;
END
$$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = '{table}'::regclass AND tgname = '{idcheckname}') THEN
        CREATE TRIGGER {idcheck} AFTER INSERT ON {table}
            REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION {idcheckfn}();
    END IF;
END
$$;
-- Relays of an ordered table read a window in the order of ord.
CREATE INDEX IF NOT EXISTS "{name}_ord_idx" ON {table} (ord) WHERE ord IS NOT NULL;

-- One row per claim, never updated: which window of transactions
-- (between snapshots lo and hi) and which part of it ((after, last] in
-- the order of tx, seq) a relay took, under which lease. A batch whose
-- lease ran out is claimed again under the next gen. On an ordered table
-- a window is taken in the order of ord: such a batch has last_tx 0 and
-- its part is (after_seq, last_seq] in ord; keys are the keys of its
-- messages (claimed while the table is ordered; NULL otherwise).
CREATE TABLE IF NOT EXISTS {batch} (
    batch_id    bigint      NOT NULL,
    gen         integer     NOT NULL,
    lo          pg_snapshot NOT NULL,
    hi          pg_snapshot NOT NULL,
    after_tx    xid8        NOT NULL,
    after_seq   bigint      NOT NULL,
    last_tx     xid8        NOT NULL,
    last_seq    bigint      NOT NULL,
    n           integer     NOT NULL,
    more        boolean     NOT NULL,
    token       uuid        NOT NULL,
    lease_until timestamptz NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    keys        text[]
) PARTITION BY LIST (((batch_id / {bchunk}) % {bparts}));
ALTER TABLE {batch} ADD COLUMN IF NOT EXISTS keys text[];
CREATE INDEX IF NOT EXISTS "{name}_batch_idx" ON {batch} (batch_id, gen);

-- What became of the messages of a batch, never updated: published (p),
-- failed or set aside behind a failed message of their key (f, then kept
-- in the failed table) or released (r).
CREATE TABLE IF NOT EXISTS {settle} (
    batch_id bigint      NOT NULL,
    gen      integer     NOT NULL,
    kind     "char"      NOT NULL,
    seqs     bigint[]    NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (((batch_id / {bchunk}) % {bparts}));
{bpartitions}CREATE INDEX IF NOT EXISTS "{name}_settle_idx" ON {settle} (batch_id, gen);

-- Messages that failed at least once, and on an ordered table those held
-- behind them (attempts 0, no last_error): a copy of the event and its
-- attempts, backoff and claim, until it is published or discarded. Its
-- rows change with failures, never with the traffic.
CREATE TABLE IF NOT EXISTS {failed} (
    id            uuid        PRIMARY KEY,
    seq           bigint      NOT NULL,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL,
    exchange      text        NOT NULL,
    routing_key   text        NOT NULL,
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL,
    headers       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    attempts      integer     NOT NULL,
    last_error    text,
    available_at  timestamptz NOT NULL,
    claimed_until timestamptz,
    claim_token   uuid,
    parked_at     timestamptz,
    published_at  timestamptz,
    discarded_at  timestamptz,
    ord           bigint
);
ALTER TABLE {failed} ADD COLUMN IF NOT EXISTS ord bigint;
CREATE INDEX IF NOT EXISTS "{name}_failed_due_idx" ON {failed} (available_at)
    WHERE published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL;
-- Claims of an ordered table ask whether a key has a message here, and
-- walk the keys and each key's messages in order.
CREATE INDEX IF NOT EXISTS "{name}_failed_key_idx" ON {failed} (event_key, (coalesce(ord, 0)), seq)
    WHERE published_at IS NULL AND discarded_at IS NULL;

-- Every event with its state, in the columns of the rows layout, for
-- operators and tests: what became of a message. It reads the settle
-- table for each event: use it to look, not in a hot path.
CREATE OR REPLACE VIEW {view} AS
SELECT o.id, o.seq, o.tx, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
    coalesce(f.available_at, o.created_at) AS available_at,
    coalesce(f.attempts, 0) AS attempts,
    f.last_error,
    CASE WHEN f.id IS NOT NULL THEN f.claimed_until ELSE c.lease_until END AS claimed_until,
    CASE WHEN f.id IS NOT NULL THEN f.claim_token ELSE c.token END AS claim_token,
    CASE WHEN f.id IS NOT NULL THEN coalesce(f.published_at, f.discarded_at)
         ELSE (SELECT min(s.at) FROM {settle} AS s WHERE s.kind = 'p' AND s.seqs @> ARRAY[o.seq]) END AS published_at,
    f.parked_at,
    f.discarded_at,
    coalesce(f.last_error IS NULL AND f.published_at IS NULL AND f.discarded_at IS NULL, false) AS held
FROM {table} AS o
LEFT JOIN {failed} AS f ON f.id = o.id
LEFT JOIN LATERAL (
    SELECT b.lease_until, b.token FROM {batch} AS b
    WHERE pg_visible_in_snapshot(o.tx, b.hi) AND NOT pg_visible_in_snapshot(o.tx, b.lo)
      AND CASE WHEN b.last_tx = '0' THEN o.ord > b.after_seq AND o.ord <= b.last_seq
          ELSE (o.tx, o.seq) > (b.after_tx, b.after_seq) AND (o.tx, o.seq) <= (b.last_tx, b.last_seq) END
      AND NOT EXISTS (SELECT 1 FROM {batch} AS x WHERE x.batch_id = b.batch_id AND x.gen > b.gen)
      AND NOT EXISTS (SELECT 1 FROM {settle} AS s WHERE s.batch_id = b.batch_id AND s.seqs @> ARRAY[o.seq] AND s.kind IN ('p', 'f', 'r'))
    LIMIT 1) AS c ON true;

-- Marks the table as one of the log layout, and its sizes. ordered_from
-- is the snapshot at which the table was last made ordered, until what
-- was committed before it (without ord) is taken, in the order of tx, seq.
CREATE TABLE IF NOT EXISTS {meta} (
    version       integer NOT NULL,
    chunk         bigint  NOT NULL,
    parts         integer NOT NULL,
    batch_chunk   bigint  NOT NULL,
    batch_parts   integer NOT NULL,
    ordered_from  pg_snapshot
);
ALTER TABLE {meta} ADD COLUMN IF NOT EXISTS ordered_from pg_snapshot;
-- Relays compute partitions from its sizes: a row deleted or changed by
-- hand is made again from what the tables are partitioned by.
DELETE FROM {meta} WHERE ctid NOT IN (SELECT ctid FROM {meta} ORDER BY version DESC LIMIT 1);
INSERT INTO {meta} (version, chunk, parts, batch_chunk, batch_parts)
SELECT {version}, {chunk}, {parts}, {bchunk}, {bparts} WHERE NOT EXISTS (SELECT 1 FROM {meta});
UPDATE {meta} AS m SET chunk = k.chunk, parts = k.parts, batch_chunk = k.bchunk, batch_parts = k.bparts
FROM (SELECT coalesce(substring(e.def FROM '\(seq / (\d+)\)')::bigint, {chunk}) AS chunk,
          coalesce(substring(e.def FROM '% \((\d+)\)')::integer, {parts}) AS parts,
          coalesce(substring(b.def FROM '\(batch_id / (\d+)\)')::bigint, {bchunk}) AS bchunk,
          coalesce(substring(b.def FROM '% \((\d+)\)')::integer, {bparts}) AS bparts
      FROM (SELECT pg_get_partkeydef('{tablelit}'::regclass) AS def) AS e,
           (SELECT pg_get_partkeydef('{batchlit}'::regclass) AS def) AS b) AS k
WHERE (m.chunk, m.parts, m.batch_chunk, m.batch_parts) IS DISTINCT FROM (k.chunk, k.parts, k.bchunk, k.bparts);

-- A claim of the next events: in one transaction, under the table's claim
-- lock, the next part of the current window of transactions, or the next
-- window when it is drained, recorded as a batch. Each statement of the
-- function takes a fresh snapshot: the cursor is read after the lock.
--
-- On an ordered table (it has its order trigger) a claim takes a window in
-- the order of ord, which is the order of commit for the rows of a key, and
-- stops before the first message whose key an unfinished batch holds (from
-- batch low on, the caller's low-water mark, or from the first when no
-- batch is that high: the table was emptied and its ids began again), so
-- that two batches never publish messages of one key; a batch claimed
-- while the table was unordered holds every key. It says of each message
-- whether its key is blocked: it has a message in the failed table, or,
-- when the batch's first message is held (a key with a backlog in flight),
-- an unfinished batch holds it. The caller sets those aside in the failed
-- table, behind the messages of their key. table_ordered says whether the
-- table was ordered when the claim ran.
DROP FUNCTION IF EXISTS {claimfn}(integer, bigint, bigint, uuid);
DROP FUNCTION IF EXISTS {claimfn}{claimargs};
CREATE FUNCTION {claimfn}(n integer, lease_us bigint, max_bytes bigint, claim_token uuid, low bigint)
RETURNS TABLE (batch_id bigint, lease_until timestamptz, id uuid, seq bigint, tx xid8, event_type text, event_key text, exchange text,
    routing_key text, payload bytea, content_type text, headers jsonb, created_at timestamptz, ord bigint, blocked boolean,
    table_ordered boolean)
-- Generic plans: a custom plan, made for the values of each call, reads
-- the partitions' statistics, which make a window of recent transactions
-- look like most of the table (or, never analysed, like anything): the
-- first five claims of every session, and every claim when PostgreSQL
-- keeps choosing custom plans, took 23-50 ms where the generic plan (index
-- scans in the order of the indexes, under LIMIT) takes 1-2 ms.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    l        record;
    m        record;
    bid      bigint := 1;
    lo       pg_snapshot := '3:3:';
    hi       pg_snapshot;
    a_tx     xid8 := '0';
    a_seq    bigint := 0;
    by_ord   boolean := false;
    ordered  boolean;
    w_min    bigint;
    w_nulls  boolean;
    every    boolean := false;
    held     text[] := '{}';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('{lockkey}', 0));
    -- The batch row need not reach the disk before the claim returns: see
    -- asyncCommit.
    PERFORM {asynccommit};
    ordered := {ordered};
    IF ordered THEN
        WITH {inflight}
        SELECT i.every, i.keys INTO every, held FROM inflight AS i;
        IF every THEN
            RETURN; -- a batch of the table's unordered days is unfinished
        END IF;
    END IF;
    SELECT b.batch_id, b.lo, b.hi, b.last_tx, b.last_seq, b.more INTO l
    FROM {batch} AS b ORDER BY b.batch_id DESC, b.gen DESC LIMIT 1;
    IF FOUND THEN
        bid := l.batch_id + 1;
        IF l.more THEN
            lo := l.lo; hi := l.hi; a_tx := l.last_tx; a_seq := l.last_seq; by_ord := l.last_tx = '0';
        ELSE
            lo := l.hi;
        END IF;
    END IF;
    IF hi IS NULL THEN
        hi := pg_current_snapshot();
        IF ordered THEN
            SELECT x.ordered_from INTO m FROM {meta} AS x;
            IF m.ordered_from IS NOT NULL THEN
                -- What was committed before the table was made ordered
                -- and not taken yet is a window of its own, up to that
                -- snapshot, in the order of tx, seq. Once there is none,
                -- there never is again.
                IF EXISTS (SELECT 1 FROM {table} AS o
                           WHERE o.tx >= pg_snapshot_xmin(lo) AND o.tx < pg_snapshot_xmax(m.ordered_from)
                             AND pg_visible_in_snapshot(o.tx, m.ordered_from) AND NOT pg_visible_in_snapshot(o.tx, lo)) THEN
                    hi := m.ordered_from;
                ELSE
                    UPDATE {meta} SET ordered_from = NULL;
                    m.ordered_from := NULL;
                END IF;
            END IF;
            IF m.ordered_from IS NULL THEN
                SELECT min(w.ord), bool_or(w.ord IS NULL) INTO w_min, w_nulls FROM (
                    (SELECT o.ord FROM {table} AS o
                     WHERE o.tx = ANY(ARRAY(SELECT pg_snapshot_xip(lo))) AND pg_visible_in_snapshot(o.tx, hi))
                    UNION ALL
                    (SELECT o.ord FROM {table} AS o
                     WHERE o.tx >= pg_snapshot_xmax(lo) AND o.tx < pg_snapshot_xmax(hi) AND pg_visible_in_snapshot(o.tx, hi))) AS w;
                IF w_nulls IS NULL THEN
                    RETURN; -- nothing new
                END IF;
                -- A row without ord (written by a trigger-less writer
                -- while the table was being made ordered by hand) makes
                -- the window one of tx, seq: nothing is left behind.
                IF NOT w_nulls THEN
                    by_ord := true;
                    a_seq := w_min - 1;
                END IF;
            END IF;
        END IF;
    END IF;
    IF by_ord THEN
        RETURN QUERY
        WITH f AS (
            SELECT o.* FROM {table} AS o
            WHERE o.ord > a_seq AND pg_visible_in_snapshot(o.tx, hi) AND NOT pg_visible_in_snapshot(o.tx, lo)
            ORDER BY o.ord LIMIT n + 1
        ), r AS (SELECT f.*, row_number() OVER (ORDER BY f.ord) AS rn,
                sum(octet_length(f.payload) + octet_length(f.headers::text)) OVER (ORDER BY f.ord) AS run,
                bool_or(f.event_key <> '' AND f.event_key = ANY(held)) OVER (ORDER BY f.ord) AS held_up
              FROM f),
        -- When the first message's key is held (a hot key with a backlog
        -- in flight), the batch takes the messages all the same and says
        -- that the held ones are blocked: they wait in the failed table,
        -- and the keys behind them pass.
        k AS (SELECT * FROM r WHERE r.rn <= n AND (r.rn = 1 OR r.run <= max_bytes)
              AND (NOT r.held_up OR (SELECT r1.held_up FROM r AS r1 WHERE r1.rn = 1))),
        last AS (SELECT k.ord FROM k ORDER BY k.ord DESC LIMIT 1),
        ins AS (
            INSERT INTO {batch} (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
            SELECT bid, 0, lo, hi, '0', a_seq, '0', last.ord, (SELECT count(*) FROM k), (SELECT count(*) FROM r) > (SELECT count(*) FROM k),
                claim_token, now() + lease_us * interval '1 microsecond',
                ARRAY(SELECT DISTINCT k.event_key FROM k WHERE k.event_key <> '')
            FROM last
            RETURNING {batch}.lease_until)
        SELECT bid, ins.lease_until, k.id, k.seq, k.tx, k.event_type, k.event_key, k.exchange, k.routing_key, k.payload, k.content_type,
            k.headers, k.created_at, k.ord,
            k.event_key <> '' AND (k.event_key = ANY(held) OR EXISTS (SELECT 1 FROM {failed} AS fl
                WHERE fl.event_key = k.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL)),
            ordered
        FROM k, ins ORDER BY k.ord;
        RETURN;
    END IF;
    -- The window's transactions that were still running at lo are read
    -- apart (see logClaimWindow); when there were none, that read is not
    -- even begun.
    IF NOT EXISTS (SELECT FROM pg_snapshot_xip(lo)) THEN
        RETURN QUERY {claimafter};
    ELSE
        RETURN QUERY {claimboth};
    END IF;
END
$$;

COMMENT ON FUNCTION {claimfn}{claimargs} IS '{claimmark}';

UPDATE {meta} SET version = {version} WHERE version < {version};
`

// logClaimWindow is the claim function's query of the next part of a
// window of transactions, unordered: {window} reads the events of the
// window after the cursor, one more than the batch (to know if there is
// more). The window's transactions that were still running at lo are
// read by a scan of their own (logClaimRunning), since their events come
// before the cursor's transaction in the tx index and may be far apart
// from each other; each scan opens every partition's index, so the
// function leaves that one out when lo has no running transactions, as
// it mostly has not (a claim then took 0.52 ms instead of 0.65 in
// PostgreSQL, BENCHMARKS.md).
const logClaimWindow = `WITH w AS (
    {window}
), f AS (SELECT * FROM w ORDER BY w.tx, w.seq LIMIT n + 1),
r AS (SELECT f.*, row_number() OVER (ORDER BY f.tx, f.seq) AS rn,
        sum(octet_length(f.payload) + octet_length(f.headers::text)) OVER (ORDER BY f.tx, f.seq) AS run,
        bool_or(ordered AND f.event_key <> '' AND f.event_key = ANY(held)) OVER (ORDER BY f.tx, f.seq) AS held_up
      FROM f),
k AS (SELECT * FROM r WHERE r.rn <= n AND (r.rn = 1 OR r.run <= max_bytes) AND NOT r.held_up),
last AS (SELECT k.tx, k.seq FROM k ORDER BY k.tx DESC, k.seq DESC LIMIT 1),
ins AS (
    INSERT INTO {batch} (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
    SELECT bid, 0, lo, hi, a_tx, a_seq, last.tx, last.seq, (SELECT count(*) FROM k), (SELECT count(*) FROM r) > (SELECT count(*) FROM k),
        claim_token, now() + lease_us * interval '1 microsecond',
        CASE WHEN ordered THEN ARRAY(SELECT DISTINCT k.event_key FROM k WHERE k.event_key <> '') END
    FROM last
    RETURNING {batch}.lease_until)
SELECT bid, ins.lease_until, k.id, k.seq, k.tx, k.event_type, k.event_key, k.exchange, k.routing_key, k.payload, k.content_type,
    k.headers, k.created_at, k.ord,
    ordered AND k.event_key <> '' AND EXISTS (SELECT 1 FROM {failed} AS fl
        WHERE fl.event_key = k.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL),
    ordered
FROM k, ins ORDER BY k.tx, k.seq`

// logClaimRunning reads the events of the window's transactions that were
// running at lo, after the cursor, in index order.
const logClaimRunning = `(SELECT o.* FROM {table} AS o
 WHERE o.tx = ANY(ARRAY(SELECT pg_snapshot_xip(lo))) AND (o.tx, o.seq) > (a_tx, a_seq) AND pg_visible_in_snapshot(o.tx, hi)
 ORDER BY o.tx, o.seq LIMIT n + 1)`

// logClaimAfter reads the events of the window's transactions that began
// after lo, after the cursor, in index order.
const logClaimAfter = `(SELECT o.* FROM {table} AS o
 WHERE {aftercursor} AND o.tx < pg_snapshot_xmax(hi) AND pg_visible_in_snapshot(o.tx, hi)
 ORDER BY o.tx, o.seq LIMIT n + 1)`

// logOrderSQL makes a table of the log layout ordered (idempotent): its
// order trigger takes the key's turn, then numbers the row (ord) — every
// row, so that a window of an ordered table is read in one order. When it
// creates the trigger, it records the boundary (ordered_from) in the next
// statement, whose snapshot sees what was written before the trigger (the
// trigger waited for those writers) and nothing written through it (those
// writers wait for this transaction).
const logOrderSQL = `CREATE OR REPLACE FUNCTION {triggerfn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_key <> '' THEN
    {turn}
    END IF;
    NEW.ord := nextval('{ordseqname}');
    RETURN NEW;
END
$$;

DO $$
BEGIN
    IF NOT {ordered} THEN
        CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {triggerfn}();
        UPDATE {meta} SET ordered_from = pg_current_snapshot();
    END IF;
END
$$;
`

// LogOrderSchema returns the DDL that makes the outbox table of the given
// name, of LayoutLog, an ordered table (see OrderedByKey): run it after
// LogSchema, or let `outbox schema --layout log --ordered` print both. On a
// table that has messages and running relays, prefer Store.ConvertOrdering
// (`outbox convert --to ordered`), which also waits for the claim in
// progress. The statements are idempotent.
func LogOrderSchema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.logOrderDDL(t.logTables()), nil
}

// logOrderDDL is the script that makes a table of the log layout ordered.
func (t table) logOrderDDL(l logTables) string {
	return t.logReplacer(l).Replace(logOrderSQL)
}

// logUnorderDDL makes a table of the log layout unordered.
func (t table) logUnorderDDL(l logTables) string {
	return t.unorderTriggerSQL() + t.logReplacer(l).Replace("UPDATE {meta} SET ordered_from = NULL;\n")
}

// CreateLogSchemaIfAbsent creates the table as one of LayoutLog (see
// LogSchema) if it does not exist yet, or brings one of an earlier log
// version up to date. A store configured OrderedByKey makes the table
// ordered. It is what CreateSchemaIfAbsent does when the table does not
// exist, and, like it, meant for development and tests.
func (s *Store) CreateLogSchemaIfAbsent(ctx context.Context) error {
	db, err := s.pool()
	if err != nil {
		return err
	}
	return s.st.createLogSchema(ctx, db)
}

// DuplicateIDsAdvice explains the failure of the log layout's DDL to
// build the unique index on the ids of a partition (SQLSTATE 23505): the
// table holds an event id twice, written before this version refused
// duplicates. It returns "" for any other error.
func DuplicateIDsAdvice(tableName string, err error) string {
	if pgerr.State(err) != "23505" {
		return ""
	}
	return fmt.Sprintf(": the table holds an event id twice, written before this version of the library refused duplicates; list them with SELECT id, array_agg(seq) FROM %s GROUP BY id HAVING count(*) > 1, delete the later copy of each (they were published already, or will be with the first) and apply the schema again", tableName)
}

// noTableError is the error of a table that does not exist. It carries
// PostgreSQL's SQLSTATE for a missing relation (42P01), as the statement
// that would have found the table missing would have: callers that
// classify errors by their state (the relay's advice, the CLI's) see what
// they saw then.
type noTableError struct{ table string }

func (e noTableError) Error() string {
	return fmt.Sprintf("outbox: table %s does not exist: create it with `outbox schema --apply` (or Store.CreateSchemaIfAbsent) or your migrations", e.table)
}

func (noTableError) SQLState() string { return "42P01" }

// Layout reads the table's layout from the database: LayoutLog when the
// table has the log layout's marker, LayoutRows when it has the columns of
// the rows layout. A table that is neither is refused with an error
// wrapping ErrInvalidTable; a missing table with one that says so. A table
// of the log layout of an earlier version is LayoutLog with an error
// wrapping ErrInvalidTable that says how to bring it up to date; so is one
// that lacks an object of the layout (its settle table, its claim
// function, a partition, …) or whose marker row was deleted or changed by
// hand, with an error that names what is wrong: `outbox schema --layout
// log --apply` (CreateLogSchemaIfAbsent) mends those. The name of an
// object the log layout makes beside an outbox table (its failed table, a
// partition, …) is refused with ErrInvalidTable: it is not an outbox table.
func (s *Store) Layout(ctx context.Context) (Layout, error) { return s.st.layout(ctx) }

// claimRevision reads the revision of a claim function from its comment:
// 1 for a function without the mark (created before revisions were
// marked).
func claimRevision(comment string) int {
	rest, marked := strings.CutPrefix(comment, logClaimMark)
	n, err := strconv.Atoi(rest)
	if !marked || err != nil || n < 1 {
		return 1
	}
	return n
}

// lockKey is the advisory lock that serialises the claims of a log table.
func (l logTables) lockKey() string { return "outbox:claim:" + l.batch }

// logPartition, logBatchPartition and logSettlePartition name the i-th
// partition of a table of LayoutLog's events, batch and settle tables:
// what logSQL creates, the layout's check looks for and maintenance
// truncates.
func (t table) logPartition(i int64) string { return t.qualified(fmt.Sprintf("%s_p%02d", t.name, i)) }
func (t table) logBatchPartition(i int64) string {
	return t.qualified(fmt.Sprintf("%s_batch_p%d", t.name, i))
}
func (t table) logSettlePartition(i int64) string {
	return t.qualified(fmt.Sprintf("%s_settle_p%d", t.name, i))
}

// pglog is t's table of the log layout, its objects named by l, as
// package pglog keeps its queue.
func (t table) pglog(l logTables) pglog.Table {
	return pglog.Table{Quoted: t.quoted, Full: t.full, OrderedNow: t.orderedNow(),
		Batch: l.batch, Settle: l.settle, Failed: l.failed, Seq: l.seq, ClaimFn: l.claimFn, LockKey: l.lockKey(),
		Chunk: l.chunk, Parts: l.parts, BatchChunk: l.batchChunk,
		Partition: t.logPartition, BatchPartition: t.logBatchPartition, SettlePartition: t.logSettlePartition}
}
