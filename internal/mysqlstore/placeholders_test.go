package mysqlstore

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// Every placeholder the package's SQL names is one that replace, list or
// replacer fills in, and no statement built at start-up keeps one: a
// misspelt placeholder would otherwise fail only when its statement runs.
func TestStatementsHaveNoPlaceholderLeft(t *testing.T) {
	known := map[string]bool{}
	for _, k := range []string{"table", "columns", "waiting", "held", "parked", "ready", "in_flight", "retrying", "failing", "now", "in", "rows", "keys", "trigger", "marker", "scheduled"} {
		known["{"+k+"}"] = true
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	placeholder := regexp.MustCompile(`\{[a-z_]+\}`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range placeholder.FindAllString(string(src), -1) {
			if !known[p] {
				t.Errorf("%s: placeholder %s is filled in by nothing", f, p)
			}
		}
	}
	s := New("billing", "outbox")
	for _, v := range []reflect.Value{reflect.ValueOf(s.q), reflect.ValueOf(s.sq), reflect.ValueOf(s.ins)} {
		for i := range v.NumField() {
			if q := v.Field(i).String(); q == "" || strings.Contains(q, "{") {
				t.Errorf("query %s: %q", v.Type().Field(i).Name, q)
			}
		}
	}
	for _, st := range append(append(append(s.SchemaStatements(), s.OrderStatements()...), s.ScheduleStatements()...), s.InsertSQL(3), s.KeyTurnSQL(2), s.ScheduleSQL(2)) {
		if strings.Contains(st, "{") {
			t.Errorf("statement keeps a placeholder: %s", st)
		}
	}
	if got := s.KeyTurnSQL(2); !strings.Contains(got, "`billing`.`outbox_keys` (event_key) VALUES (?),(?)") {
		t.Errorf("KeyTurnSQL(2) = %s", got)
	}
}
