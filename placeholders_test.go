package outbox

import (
	"reflect"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/acemq/outbox/internal/pglog"
)

// placeholder is how the statements' templates mark what is filled in when
// the store is built ({table}, {batch}, …): none may be left in a
// statement, where it would fail only when the statement runs.
var placeholder = regexp.MustCompile(`\{[a-z][a-z_]*\}`)

// Issue 40: every statement a store builds, of each layout and each
// ordering mode, and every DDL text, is checked for a placeholder left
// unreplaced (a misspelt one, or one its replacer does not know).
func TestStatementsHaveNoPlaceholderLeft(t *testing.T) {
	texts := map[string]string{}
	strs := func(prefix string, v reflect.Value) {
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.String {
				texts[prefix+"."+v.Type().Field(i).Name] = f.String()
			}
		}
	}
	for _, name := range []string{"outbox", "app.events_outbox"} {
		for _, ordering := range []Ordering{Unordered, OrderedByKey} {
			s, err := NewStore(nil, &StoreConfig{Table: name, Ordering: ordering})
			require.NoError(t, err)
			for what, text := range s.rows.Texts(ordering == OrderedByKey) {
				texts[name+" rows "+ordering.String()+" "+what] = text
			}
			strs(name+" turns", reflect.ValueOf(s.turns))
			l := s.t.logTables()
			for what, text := range pglog.New(s.t.pglog(l), pglog.Config{}).Texts() {
				texts[name+" log "+what] = text
			}
			texts[name+" logSQL"] = s.t.logSQL(l)
			texts[name+" logOrderDDL"] = s.t.logOrderDDL(l)
			texts[name+" logUnorderDDL"] = s.t.logUnorderDDL(l)
		}
		s, err := NewStore(nil, &StoreConfig{Table: name})
		require.NoError(t, err)
		texts[name+" createSQL"] = s.t.createSQL()
		texts[name+" orderSQL"] = s.t.orderSQL()
		texts[name+" dropSQL"] = s.t.dropSQL()
		texts[name+" dropOrderSQL"] = s.t.dropOrderSQL()
		texts[name+" orderTriggerSQL"] = s.t.orderTriggerSQL()
		texts[name+" unorderTriggerSQL"] = s.t.unorderTriggerSQL()
		texts[name+" scheduledSQL"] = s.t.scheduledSQL()
		pg := newPGScheduler(s.t)
		texts[name+" promote"], texts[name+" scheduledCount"], texts[name+" scheduleSQL"] = pg.promoteQ, pg.countQ, pg.scheduleSQL(3)
		for what, f := range map[string]func(string) (string, error){"Schema": Schema, "RowsSchema": RowsSchema, "LogSchema": LogSchema,
			"OrderSchema": OrderSchema, "NotifySchema": NotifySchema} {
			ddl, err := f(name)
			require.NoError(t, err)
			texts[name+" "+what] = ddl
		}
	}
	empty := 0
	for what, text := range texts {
		if text == "" {
			empty++
			continue
		}
		require.Empty(t, placeholder.FindAllString(text, -1), "%s holds a placeholder nothing filled in:\n%s", what, text)
	}
	require.Greater(t, len(texts)-empty, 100, "the statements were found")
}
