package outbox

import (
	"strconv"
	"strings"
)

// keyTurns are the statements with which Store.Add takes the turns of its
// keys on an ordered table of PostgreSQL, of either layout (see
// keyLocksMax and the trigger's keyTurn). Both take the keys of a call in
// the order of their slots, and of their locks within a slot, so that two
// writers never take two locks in opposite orders, with the rules of the
// trigger's keyTurn, decided here for each slot as a whole: a slot whose
// keys all fit the budget is taken key by key, another exclusively. The
// trigger of an ordered table then finds each key taken. A table whose
// trigger is older (no keyTurnMark in it) takes slots, and so do these
// statements then.
type keyTurns struct {
	// lock is an ordered store's. $1: the table's name; $2: the keys;
	// $3: keyTurnSetting; $4: the trigger's function.
	lock string
	// lockIfOrdered is an unordered store's Add of several keys, which
	// takes them in the same order when the table is ordered ($5: the
	// table, $6: its trigger), so that the trigger, taking them row by
	// row, never deadlocks with another writer. It returns no row when
	// the table is unordered.
	lockIfOrdered string
}

func newKeyTurns() keyTurns {
	return keyTurns{
		lock:          keyTurnSQL(""),
		lockIfOrdered: keyTurnSQL(`EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass($5) AND tgname = $6 AND tgenabled <> 'D')`),
	}
}

// keyTurnSQL is Store.Add's statement that takes the turns of a call's keys
// (see keyLocksMax and the trigger's keyTurn), when the condition cond
// holds ("": always).
func keyTurnSQL(cond string) string {
	if cond == "" {
		cond = "true"
	}
	return strings.NewReplacer("{slot}", slotOf("k"), "{keyid}", keyLockID("$1", "k"), "{slotid}", slotLockID("$1", "s"), "{max}", strconv.Itoa(keyLocksMax),
		"{max2}", strconv.Itoa(2*keyLocksMax), "{mark}", keyTurnMark, "{cond}", cond).Replace(`WITH st AS (
	SELECT coalesce(nullif(current_setting($3 || 'n', true), ''), '0')::int AS n0,
		coalesce(nullif(current_setting($3 || 'k', true), ''), ',') AS ks,
		coalesce(nullif(current_setting($3 || 'f', true), ''), ',') AS fs,
		coalesce(nullif(current_setting($3 || 'c', true), ''), ',') AS cs,
		EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE oid = to_regproc($4) AND strpos(prosrc, '{mark}') > 0) AS bykey
	WHERE {cond}
), keys AS (
	SELECT DISTINCT {slot} AS s, {keyid} AS h
	FROM unnest($2::text[]) AS k
), todo AS ( -- the keys not taken yet, with the count of those up to the end of their slot
	SELECT keys.s, keys.h, strpos(st.fs, ',' || keys.s || ',') > 0 AS shared, count(*) OVER (ORDER BY keys.s) AS upto
	FROM keys, st
	WHERE strpos(st.cs, ',' || keys.s || ',') = 0 AND strpos(st.ks, ',' || keys.h || ',') = 0
), d AS (
	SELECT todo.*, st.bykey AND st.n0 + todo.upto <= CASE WHEN todo.shared THEN {max2} ELSE {max} END AS bykey
	FROM todo, st
), locks AS (
	SELECT s, 0 AS kind, {slotid} AS id FROM d WHERE bykey AND NOT shared GROUP BY s
	UNION ALL SELECT s, 1, h FROM d WHERE bykey
	UNION ALL SELECT s, 2, {slotid} FROM d WHERE NOT bykey GROUP BY s
)
SELECT (SELECT count(CASE WHEN kind = 0 THEN pg_advisory_xact_lock_shared(id) ELSE pg_advisory_xact_lock(id) END)
		FROM (SELECT kind, id FROM locks ORDER BY s, kind, id) AS ordered),
	set_config($3 || 'n', (st.n0 + (SELECT count(*) FROM d WHERE bykey))::text, true),
	set_config($3 || 'k', st.ks || coalesce((SELECT string_agg(h::text, ',') || ',' FROM d WHERE bykey), ''), true),
	set_config($3 || 'f', st.fs || coalesce((SELECT string_agg(DISTINCT s::text, ',') || ',' FROM d WHERE bykey AND NOT shared), ''), true),
	set_config($3 || 'c', st.cs || coalesce((SELECT string_agg(DISTINCT s::text, ',') || ',' FROM d WHERE NOT bykey), ''), true)
FROM st`)
}
