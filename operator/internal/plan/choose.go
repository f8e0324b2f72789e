package plan

import "sort"

// Candidate is a ready worker of the wanted media, as seen when a series is placed.
type Candidate struct {
	Node string
	Pod  string
	// StoredBytes is the worker's container bytes (GET /v1/stats); Reachable is false when
	// the stats call failed, and such a worker is never chosen.
	StoredBytes int64
	Reachable   bool
	// Placed is how many BackupSeries already name this worker in their status: it breaks ties
	// between equally full workers, so series created together spread out before any of them
	// has data.
	Placed int
}

// ChooseWorker picks the least used reachable worker: fewest stored bytes, then fewest placed
// series, then the node name (so the choice is deterministic). ok is false when none is
// reachable.
func ChooseWorker(cands []Candidate) (c Candidate, ok bool) {
	var usable []Candidate
	for _, x := range cands {
		if x.Reachable {
			usable = append(usable, x)
		}
	}
	if len(usable) == 0 {
		return Candidate{}, false
	}
	sort.SliceStable(usable, func(i, j int) bool {
		a, b := usable[i], usable[j]
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
