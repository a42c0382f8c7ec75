package admit

import "testing"

// One tenant holds at most a quarter of the slots for its held
// rejections, so that another tenant's rejections are still held (and
// its clients slowed) while the first one storms; a slot given back is
// taken again, and a tenant holding none keeps no entry.
func TestDelaySlotsArePerTenantFirst(t *testing.T) {
	s := NewDelaySlots(8)
	for i := range 2 {
		if !s.take("storm") {
			t.Fatalf("storm's slot %d refused under its quarter", i+1)
		}
	}
	if s.take("storm") {
		t.Error("storm took a third of 8 slots, want at most a quarter")
	}
	for i := range 2 {
		if !s.take("system:serviceaccount:ns:sa" + string(rune('a'+i))) {
			t.Errorf("a service account's slot refused while ns holds %d", i)
		}
	}
	if s.take("system:serviceaccount:ns:sac") {
		t.Error("a third service account of one namespace took a slot: the namespace is one tenant")
	}
	for _, c := range []string{"alice", "bob", "carol", "dave"} {
		if !s.take(c) {
			t.Errorf("%s refused with %d slots free", c, 8-s.n)
		}
	}
	if s.take("erin") {
		t.Error("a ninth slot taken of 8")
	}
	s.give("storm")
	if !s.take("storm") {
		t.Error("storm could not take back the slot it gave")
	}
	s.give("storm")
	s.give("storm")
	if _, ok := s.held["storm"]; ok {
		t.Error("a tenant holding no slot keeps an entry")
	}
}

// Without slots (0) nothing is held; one slot is one tenant's.
func TestDelaySlotsSmall(t *testing.T) {
	if NewDelaySlots(0).take("a") {
		t.Error("a slot taken of 0")
	}
	s := NewDelaySlots(1)
	if !s.take("a") || s.take("b") {
		t.Error("one slot: want the first taker only")
	}
}
