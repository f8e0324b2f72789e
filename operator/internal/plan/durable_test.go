package plan

import (
	"strings"
	"testing"
	"time"
)

func TestDurabilityOf(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	behind := 30 * time.Minute
	for _, tc := range []struct {
		name             string
		latest, durable  int64
		age              time.Duration
		ok               bool
		reason, contains string
	}{
		{"no versions", 0, 0, 0, true, "NoVersions", "nothing"},
		{"all uploaded", 7, 7, time.Hour, true, "InTime", "holds version 7, the newest"},
		{"just backed up", 7, 6, time.Minute, true, "InTime", "holds version 6; version 7"},
		{"nothing uploaded yet, recent", 1, 0, time.Minute, true, "InTime", "holds no version"},
		{"behind", 7, 5, time.Hour, false, "RemoteBehind", "holds version 5, the newest is version 7"},
		{"behind at the limit", 7, 5, behind, false, "RemoteBehind", "more than 30m0s"},
	} {
		d := DurabilityOf(tc.latest, tc.durable, now.Add(-tc.age), now, behind)
		if d.OK != tc.ok || d.Reason != tc.reason || !strings.Contains(d.Message, tc.contains) {
			t.Errorf("%s: %+v", tc.name, d)
		}
	}
}

func TestAdoptionHold(t *testing.T) {
	durable := []StoreSeries{{"a/db", 3, 3}, {"b/web", 0, 0}}
	behind := []StoreSeries{{"a/db", 5, 3}, {"b/web", 2, 2}}
	for _, tc := range []struct {
		name     string
		series   []StoreSeries
		gone     bool
		contains string // "" when it may be adopted
	}{
		{"NotReady, all in the bucket", durable, false, ""},
		{"gone, all in the bucket", durable, true, ""},
		{"NotReady, versions only on the node", behind, false, "a/db (versions 4 to 5)"},
		{"gone, versions only on the node: they went with it", behind, true, ""},
		{"nothing in the bucket", []StoreSeries{{"a/db", 2, 0}}, true, "would be empty"},
		{"nothing in the bucket, NotReady", []StoreSeries{{"a/db", 2, 0}}, false, "would be empty"},
		{"no series", nil, true, ""},
	} {
		got := AdoptionHold(tc.series, tc.gone)
		if (tc.contains == "") != (got == "") || !strings.Contains(got, tc.contains) {
			t.Errorf("%s: %q", tc.name, got)
		}
	}
}
