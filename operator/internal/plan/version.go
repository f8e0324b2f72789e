package plan

import (
	"fmt"
	"strconv"
	"time"
)

// VersionAt is a version number and its time.
type VersionAt struct {
	Number int64
	Time   time.Time
}

// ResolveVersion turns a RestoreJob's version ("latest", a number, or an RFC 3339 time) into a
// version number of the series, or an error that says why none matches.
func ResolveVersion(sel, series string, versions []VersionAt) (int64, error) {
	if len(versions) == 0 {
		return 0, fmt.Errorf("series %s has no versions yet", series)
	}
	newest, oldest := versions[0], versions[0]
	for _, v := range versions {
		if v.Number > newest.Number {
			newest = v
		}
		if v.Number < oldest.Number {
			oldest = v
		}
	}
	switch {
	case sel == "" || sel == "latest":
		return newest.Number, nil
	case isNumber(sel):
		n, err := strconv.ParseInt(sel, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("version %q is not a version number", sel)
		}
		for _, v := range versions {
			if v.Number == n {
				return n, nil
			}
		}
		return 0, fmt.Errorf("series %s has no version %d (latest is %d)", series, n, newest.Number)
	default:
		t, err := time.Parse(time.RFC3339Nano, sel)
		if err != nil {
			return 0, fmt.Errorf("version %q is neither a number, \"latest\", nor an RFC 3339 time", sel)
		}
		var best *VersionAt
		for i := range versions {
			v := &versions[i]
			if v.Time.After(t) {
				continue
			}
			if best == nil || v.Time.After(best.Time) || (v.Time.Equal(best.Time) && v.Number > best.Number) {
				best = v
			}
		}
		if best == nil {
			return 0, fmt.Errorf("series %s has no version taken at or before %s (the oldest, %d, is from %s)",
				series, t.UTC().Format(time.RFC3339), oldest.Number, oldest.Time.UTC().Format(time.RFC3339))
		}
		return best.Number, nil
	}
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
