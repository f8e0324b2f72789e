package plan

import (
	"sort"
	"time"
)

// VersionAt is a version number and its time.
type VersionAt struct {
	Number int64
	Time   time.Time
}

// RetentionRules are a RetentionPolicy's keep rules; nil means the rule is not set.
type RetentionRules struct {
	KeepVersions *int64
	KeepWithin   *time.Duration
}

// Expiring returns, oldest first, the versions the rules do not keep. A version is kept when
// any rule keeps it: keepVersions keeps the newest N; keepWithin keeps versions taken within
// that duration of the newest version's time (not of the clock). The newest version is always
// kept, and with no rule at all every version is. These are the worker's semantics (the worker
// decides what it deletes; the operator uses this to show what the next expiry removes).
func Expiring(versions []VersionAt, r RetentionRules) []int64 {
	if len(versions) == 0 || (r.KeepVersions == nil && r.KeepWithin == nil) {
		return nil
	}
	vs := append([]VersionAt(nil), versions...)
	sort.Slice(vs, func(i, j int) bool { return vs[i].Number < vs[j].Number })
	newest := vs[0].Time
	for _, v := range vs {
		if v.Time.After(newest) {
			newest = v.Time
		}
	}
	n := len(vs)
	var out []int64
	for i, v := range vs {
		byCount := r.KeepVersions != nil && int64(n-i) <= *r.KeepVersions
		byAge := r.KeepWithin != nil && newest.Sub(v.Time) <= *r.KeepWithin
		if byCount || byAge || i == n-1 {
			continue
		}
		out = append(out, v.Number)
	}
	return out
}
