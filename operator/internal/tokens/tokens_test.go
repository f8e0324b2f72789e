package tokens

import (
	"reflect"
	"testing"
)

func TestParseFormat(t *testing.T) {
	in := "# worker tokens\n\nbbb team-b\naaa *\n  ccc   team-a  \n"
	es, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{{"bbb", "team-b"}, {"aaa", "*"}, {"ccc", "team-a"}}
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("Parse = %v, want %v", es, want)
	}
	if got := Format(es); got != "aaa *\nccc team-a\nbbb team-b\n" {
		t.Fatalf("Format = %q (admin first, then by namespace)", got)
	}
	if tok, ok := Lookup(es, "team-a"); !ok || tok != "ccc" {
		t.Errorf("Lookup team-a = %q, %v", tok, ok)
	}
	if _, ok := Lookup(es, "team-c"); ok {
		t.Errorf("Lookup of a missing namespace succeeded")
	}
	if _, err := Parse("lonelytoken\n"); err == nil {
		t.Errorf("a line without scope was accepted")
	}
	if _, err := Parse("a b c\n"); err == nil {
		t.Errorf("a line with three fields was accepted")
	}
}

func TestGenerate(t *testing.T) {
	a, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate()
	if len(a) != 64 || a == b {
		t.Fatalf("tokens %q %q: want 64 hex characters, different each time", a, b)
	}
}
