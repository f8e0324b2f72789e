package controller

import (
	"slices"
	"testing"

	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// What a move left on the old worker is deleted only when the series' worker holds it (same
// size) or has expired it since; a version above the switch's newest is never deleted.
func TestOldCopyFate(t *testing.T) {
	v := func(n, bytes int64) workerclient.Version { return workerclient.Version{Number: n, LogicalBytes: bytes} }
	old := []workerclient.Version{v(2, 20), v(3, 30), v(4, 40), v(5, 50)}
	cases := []struct {
		what          string
		cur           []workerclient.Version
		through       int64
		del           []int64
		only, missing []string
	}{
		{"all held", []workerclient.Version{v(2, 20), v(3, 30), v(4, 40), v(5, 50)}, 5, []int64{2, 3, 4, 5}, nil, nil},
		{"oldest expired on the new worker", []workerclient.Version{v(4, 40), v(5, 50), v(6, 60)}, 5, []int64{2, 3, 4, 5}, nil, nil},
		{"written to the old worker after the switch", []workerclient.Version{v(2, 20), v(3, 30), v(4, 40)}, 4, []int64{2, 3, 4}, []string{"5"}, nil},
		{"same number, other size", []workerclient.Version{v(2, 20), v(3, 31), v(4, 40), v(5, 50)}, 5, []int64{2, 4, 5}, nil, []string{"3"}},
		{"new worker reset: holds only newer versions", []workerclient.Version{v(6, 60)}, 5, nil, nil, []string{"2", "3", "4", "5"}},
		{"new worker empty", nil, 5, nil, nil, []string{"2", "3", "4", "5"}},
	}
	for _, c := range cases {
		del, only, missing := oldCopyFate(old, c.cur, c.through)
		if !slices.Equal(del, c.del) || !slices.Equal(only, c.only) || !slices.Equal(missing, c.missing) {
			t.Errorf("%s: del %v only %v missing %v; want %v %v %v", c.what, del, only, missing, c.del, c.only, c.missing)
		}
	}
}
