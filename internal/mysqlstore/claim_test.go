package mysqlstore

import (
	"testing"

	"github.com/acemq/outbox/internal/backend"
)

// A claim returns a key's rows in their key's order (ord, then seq), each
// key keeping the places its rows have in the order of seq: two writers
// of a key can draw their seqs in the other order than they took its turn.
func TestInKeyOrder(t *testing.T) {
	rows := []backend.Row{
		{Seq: 10, Key: "a", Ord: 2},
		{Seq: 11, Key: ""},
		{Seq: 12, Key: "b", Ord: 1},
		{Seq: 13, Key: "a", Ord: 1},
		{Seq: 14, Key: "a", Ord: 3},
		{Seq: 15, Key: "c", Ord: 0},
		{Seq: 16, Key: "c", Ord: 0},
	}
	inKeyOrder(rows)
	var got []int64
	for _, r := range rows {
		got = append(got, r.Seq)
	}
	want := []int64{13, 11, 12, 10, 14, 15, 16}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}
