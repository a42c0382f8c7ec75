package inspect

import (
	"testing"
)

// One caller that spent its share is refused more while another still
// takes its own; bytes given back can be taken again, and a caller that
// holds nothing keeps no entry.
func TestSharedBytesShareEachCaller(t *testing.T) {
	b := NewSharedBytes(100, 40)
	for i := range 4 {
		if !b.take("mallory", 10) {
			t.Fatalf("mallory's take %d within its share refused", i+1)
		}
	}
	if b.take("mallory", 1) {
		t.Error("mallory took beyond its share of 40")
	}
	if !b.take("alice", 40) {
		t.Error("alice refused her share while mallory held his")
	}
	if b.take("bob", 21) {
		t.Error("bob took beyond what is left of the total (20)")
	}
	if !b.take("bob", 20) {
		t.Error("bob refused what is left of the total")
	}
	if got := b.InUse(); got != 100 {
		t.Errorf("in use %d, want 100", got)
	}
	b.give("mallory", 40)
	if !b.take("carol", 40) {
		t.Error("carol refused the bytes mallory gave back")
	}
	if _, ok := b.byKey["mallory"]; ok {
		t.Error("mallory holds nothing but keeps an entry")
	}
	if len(b.byKey) != 3 {
		t.Errorf("%d entries, want 3 (alice, bob, carol)", len(b.byKey))
	}
}
