package plan

import (
	"fmt"
	"sort"
)

// Candidate is a ready worker of the wanted media, as seen when a series is placed.
type Candidate struct {
	Node string
	Pod  string
	// StoredBytes is the worker's container bytes (GET /v1/stats); Reachable is false when
	// the stats call failed, and such a worker is never chosen.
	StoredBytes int64
	Reachable   bool
	// Room is the room on the worker's filesystems; nil when the worker does not say (an
	// older worker), and then it is placed by StoredBytes alone.
	Room *Room
	// Placed is how many BackupSeries already name this worker in their status: it breaks ties
	// between equally full workers, so series created together spread out before any of them
	// has data.
	Placed int
}

// Room is the size and free bytes of the filesystems holding a store's containers and its
// metadata, and the share of each that must stay free for the worker to take a new series.
type Room struct {
	DataTotal, DataFree, MetaTotal, MetaFree int64
	// MinFreePercent is the operator's --min-free-percent: below it, what is left is for the
	// series the worker already holds, which grow with every backup. 0 turns the check off.
	MinFreePercent int
	// Degraded is why the worker's store takes no work that writes (its stats' `degraded`: a
	// full disk), "" when it takes work. Such a worker stays ready (it serves restores) but
	// takes no new series, whatever MinFreePercent says.
	Degraded string
}

// DefaultMinFreePercent is the kubelet's own default for a node's filesystem
// (nodefs.available<10%), below which it starts evicting pods anyway.
const DefaultMinFreePercent = 10

// NearlyFull says why a worker takes no new series ("" when it does): less than
// Room.MinFreePercent of either filesystem free.
func (c Candidate) NearlyFull() string {
	if c.Room == nil {
		return ""
	}
	if c.Room.Degraded != "" {
		return "a degraded store (" + c.Room.Degraded + ")"
	}
	for _, fs := range []struct {
		what        string
		free, total int64
	}{{"containers", c.Room.DataFree, c.Room.DataTotal}, {"metadata", c.Room.MetaFree, c.Room.MetaTotal}} {
		// In floating point: sizes near the int64 limit (a cluster filesystem) must not wrap.
		need := c.Room.MinFreePercent
		if pct := 100 * float64(fs.free) / float64(fs.total); fs.total > 0 && pct < float64(need) {
			return fmt.Sprintf("%d%% free for %s of %s (new series need %d%%)",
				int(pct), fs.what, HumanBytes(fs.total), need)
		}
	}
	return ""
}

// roomStep is the free room that counts as a difference between workers: 1 GiB or 1% of the
// smallest filesystem, whichever is more. Free room moves by itself (other writers, a worker's
// own compactions), so two workers on disks alike must not be told apart by noise: within a
// step, the fewer stored bytes decide. (1% of the largest would round every small disk of a
// mixed fleet to no step at all.)
func roomStep(cands []Candidate) int64 {
	smallest := int64(0)
	for _, c := range cands {
		if c.Room != nil && c.Room.DataTotal > 0 && (smallest == 0 || c.Room.DataTotal < smallest) {
			smallest = c.Room.DataTotal
		}
	}
	return max(int64(1<<30), smallest/100)
}

// freeSteps is the room a new series would grow into (the containers' filesystem), in steps;
// ok is false when the worker does not report it.
func (c Candidate) freeSteps(step int64) (int64, bool) {
	if c.Room == nil {
		return 0, false
	}
	return c.Room.DataFree / step, true
}

// ChooseWorker picks the reachable worker, not nearly full, with the most free room (counted in
// steps, see roomStep; then the fewest stored bytes, then the fewest placed series, then the node name, so the choice is
// deterministic). Workers that do not report their room come after those that do. ok is
// false when none can take the series.
func ChooseWorker(cands []Candidate) (c Candidate, ok bool) {
	var usable []Candidate
	for _, x := range cands {
		if x.Reachable && x.NearlyFull() == "" {
			usable = append(usable, x)
		}
	}
	if len(usable) == 0 {
		return Candidate{}, false
	}
	step := roomStep(usable)
	sort.SliceStable(usable, func(i, j int) bool {
		a, b := usable[i], usable[j]
		fa, ka := a.freeSteps(step)
		fb, kb := b.freeSteps(step)
		if ka != kb {
			return ka
		}
		if fa != fb {
			return fa > fb
		}
		if a.StoredBytes != b.StoredBytes {
			return a.StoredBytes < b.StoredBytes
		}
		if a.Placed != b.Placed {
			return a.Placed < b.Placed
		}
		return a.Node < b.Node
	})
	return usable[0], true
}
