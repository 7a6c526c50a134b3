package outbox

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/google/uuid"
)

// SetClock makes s give its messages ids from the clock now, as a writer
// whose clock is wrong would.
func SetClock(s *Store, now func() time.Time) {
	s.newID = func() (uuid.UUID, error) {
		id, err := uuid.NewV7()
		if err != nil {
			return id, err
		}
		var ms [8]byte
		binary.BigEndian.PutUint64(ms[:], uint64(now().UnixMilli()))
		copy(id[:6], ms[2:])
		return id, nil
	}
}

// SchemaV1 returns the DDL of the first version of the table: what
// migration 000001 alone creates.
func SchemaV1(name string) (string, error) {
	t, err := parseTable(name)
	if err != nil {
		return "", err
	}
	return t.createSQL(), nil
}

// LogSchemaSized returns the DDL of a log table with small partitions, so
// that tests can fill them.
func LogSchemaSized(name string, chunk, parts, batchChunk int64) (string, error) {
	t, err := parseTable(name)
	if err != nil {
		return "", err
	}
	l := t.logTables()
	l.chunk, l.parts, l.batchChunk = chunk, parts, batchChunk
	return t.logSQL(l), nil
}

// SetLogLow sets the low-water mark of s's log table, below which s takes
// every batch to be finished, as a store that saw batches up to low before
// the table was emptied has it.
func SetLogLow(s *Store, low int64) { s.log.SetLow(low) }

// SetLogClock makes the log store of s (its table must have LayoutLog and
// have been read) tell the time from now.
func SetLogClock(s *Store, now func() time.Time) { s.log.SetClock(now) }

// LogLookEvery returns how often the log store of s looks for batches to
// take over and for failed messages due again.
func LogLookEvery(s *Store) time.Duration { return s.log.LookEvery() }

// LogClaimSQL and LogSettleSQL return the statements with which the log
// store of s claims a batch and settles messages of one.
func LogClaimSQL(s *Store) string  { return s.log.Texts()["claim"] }
func LogSettleSQL(s *Store) string { return s.log.Texts()["settle"] }

// RowsSettleSQL returns the statements with which s claims, marks
// published, releases and marks failed messages of a table of the rows
// layout, in the table's current mode.
func RowsSettleSQL(s *Store) (claim, markPublished, release, markFailed string) {
	q := s.rows.Texts(s.Ordering() == OrderedByKey)
	return q["claim"], q["markPublished"], q["release"], q["markFailed"]
}

// RotateLog rotates the batch and settle tables of the log store of s now,
// as Maintain does every second.
func RotateLog(ctx context.Context, s *Store) error { return s.log.RotateBatches(ctx, s.db) }

// SetDueLook sets how long after a look s's MoveDue looks at the
// scheduled table again before the next due time it knows of (a second),
// so that a test can tell a look that a due time makes from one that time
// makes.
func SetDueLook(s *Store, d time.Duration) { s.dueLook = d }

// ReadOrderSQL is the statement that reads a table's ordering mode.
const ReadOrderSQL = readOrderSQL

// SetLogServer makes the log store of s take its low-water mark to have
// been learnt from server, as a store that has failed over to another.
func SetLogServer(s *Store, server string) { s.log.SetServer(server) }

// LogLow returns the low-water mark of s's log table.
func LogLow(s *Store) int64 { return s.log.Low() }
