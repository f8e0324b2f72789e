package plan

import "testing"

// The annotation values round-trip, and anything malformed is refused rather than read as a
// store (a move deletes data on the store a moved-from value names).
func TestStoreRefs(t *testing.T) {
	s := StoreRef{Media: "ssd", Node: "node-a"}
	if got, ok := ParseStoreRef(s.String()); !ok || got != s {
		t.Fatalf("%q parsed as %+v %v", s.String(), got, ok)
	}
	if got, n, ok := ParseMovedFrom(MovedFrom(s, 7)); !ok || got != s || n != 7 {
		t.Fatalf("%q parsed as %+v %d %v", MovedFrom(s, 7), got, n, ok)
	}
	if got, ok := StoreOfRecord("ssd/node-a@7"); !ok || got != s {
		t.Fatalf("StoreOfRecord: %+v %v", got, ok)
	}
	for _, bad := range []string{"", "ssd", "ssd/", "/node-a", "ssd/a/b"} {
		if _, ok := ParseStoreRef(bad); ok {
			t.Errorf("ParseStoreRef(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"ssd/node-a", "ssd/node-a@", "ssd/node-a@x", "ssd/node-a@-1", "ssd@3"} {
		if _, _, ok := ParseMovedFrom(bad); ok {
			t.Errorf("ParseMovedFrom(%q) accepted", bad)
		}
	}
}
