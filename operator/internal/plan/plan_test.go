package plan

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestChooseWorker(t *testing.T) {
	cases := []struct {
		name  string
		cands []Candidate
		want  string
		ok    bool
	}{
		{"none", nil, "", false},
		{"all unreachable", []Candidate{{Node: "a"}, {Node: "b"}}, "", false},
		{"least stored bytes wins", []Candidate{
			{Node: "a", StoredBytes: 300, Reachable: true},
			{Node: "b", StoredBytes: 100, Reachable: true},
			{Node: "c", StoredBytes: 200, Reachable: true},
		}, "b", true},
		{"unreachable is skipped even if emptiest", []Candidate{
			{Node: "a", StoredBytes: 0, Reachable: false},
			{Node: "b", StoredBytes: 500, Reachable: true},
		}, "b", true},
		{"equal bytes: fewest placed series", []Candidate{
			{Node: "a", Reachable: true, Placed: 2},
			{Node: "b", Reachable: true, Placed: 1},
			{Node: "c", Reachable: true, Placed: 3},
		}, "b", true},
		{"bytes beat placed count", []Candidate{
			{Node: "a", StoredBytes: 10, Reachable: true, Placed: 0},
			{Node: "b", StoredBytes: 5, Reachable: true, Placed: 9},
		}, "b", true},
		{"most free room wins over fewest stored bytes", []Candidate{
			{Node: "a", Reachable: true, StoredBytes: 1, Room: room(50*gib, 100*gib)},
			{Node: "b", Reachable: true, StoredBytes: 9, Room: room(80*gib, 100*gib)},
		}, "b", true},
		{"a mixed fleet: the small disks are told apart too", []Candidate{
			{Node: "a", Reachable: true, StoredBytes: 1, Room: room(150*gib, 1000*gib)},
			{Node: "b", Reachable: true, StoredBytes: 9, Room: room(900*gib, 1000*gib)},
			{Node: "c", Reachable: true, StoredBytes: 0, Room: room(20_000*gib, 100_000*gib)},
		}, "c", true},
		{"free room within a step (1% of the smallest disk) is a tie: stored bytes decide", []Candidate{
			{Node: "a", Reachable: true, StoredBytes: 9, Room: room(50*gib+gib/2, 300*gib)},
			{Node: "b", Reachable: true, StoredBytes: 1, Room: room(50*gib, 300*gib)},
		}, "b", true},
		{"a nearly full worker takes no new series, however empty its store", []Candidate{
			{Node: "a", Reachable: true, StoredBytes: 0, Room: room(9, 100)},
			{Node: "b", Reachable: true, StoredBytes: 500, Room: room(30, 100)},
		}, "b", true},
		{"nearly full metadata counts too", []Candidate{
			{Node: "a", Reachable: true, Room: &Room{DataTotal: 100, DataFree: 90, MetaTotal: 100, MetaFree: 5, MinFreePercent: 10}},
			{Node: "b", Reachable: true, Room: room(20, 100)},
		}, "b", true},
		{"every worker nearly full: none", []Candidate{
			{Node: "a", Reachable: true, Room: room(9, 100)},
			{Node: "b", Reachable: true, Room: room(0, 100)},
		}, "", false},
		{"a worker that reports its room before one that does not", []Candidate{
			{Node: "a", Reachable: true, StoredBytes: 0},
			{Node: "b", Reachable: true, StoredBytes: 100, Room: room(11, 100)},
		}, "b", true},
		{"full tie: node name", []Candidate{
			{Node: "zeta", Reachable: true},
			{Node: "alpha", Reachable: true},
		}, "alpha", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ChooseWorker(c.cands)
			if ok != c.ok || got.Node != c.want {
				t.Fatalf("ChooseWorker = %q, %v; want %q, %v", got.Node, ok, c.want, c.ok)
			}
		})
	}
}

func TestResolveVersion(t *testing.T) {
	t0 := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	vs := []VersionAt{{3, t0}, {4, t0.Add(time.Hour)}, {6, t0.Add(3 * time.Hour)}}
	cases := []struct {
		sel     string
		vs      []VersionAt
		want    int64
		wantErr string
	}{
		{"latest", vs, 6, ""},
		{"", vs, 6, ""},
		{"4", vs, 4, ""},
		{"5", vs, 0, "series ns/db has no version 5 (latest is 6)"},
		{"latest", nil, 0, "series ns/db has no versions yet"},
		{"2025-06-01T01:30:00Z", vs, 4, ""},
		{"2025-06-01T01:00:00Z", vs, 4, ""},      // exactly at a version's time
		{"2025-06-01T03:00:00+02:00", vs, 4, ""}, // 01:00Z, with an offset
		{"2025-06-01T01:30:00+02:00", vs, 0, "no version taken at or before 2025-05-31T23:30:00Z"},
		{"2025-06-01T05:00:00+02:00", vs, 6, ""}, // 03:00Z
		{"2024-12-31T00:00:00Z", vs, 0, "no version taken at or before 2024-12-31T00:00:00Z (the oldest, 3, is from 2025-06-01T00:00:00Z)"},
		{"yesterday", vs, 0, "neither a number"},
		{"99999999999999999999", vs, 0, "not a version number"},
	}
	for _, c := range cases {
		t.Run(c.sel, func(t *testing.T) {
			got, err := ResolveVersion(c.sel, "ns/db", c.vs)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ResolveVersion(%q) = %d, %v; want error containing %q", c.sel, got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("ResolveVersion(%q) = %d, %v; want %d", c.sel, got, err, c.want)
			}
		})
	}
}

func TestParseScheduleAndNextRun(t *testing.T) {
	for _, s := range []string{"0 2 * * *", "*/15 * * * *", "@daily", "@hourly", "0 0 1 jan *", "0 3 * * MON-FRI"} {
		if _, err := ParseSchedule(s); err != nil {
			t.Errorf("ParseSchedule(%q): %v", s, err)
		}
	}
	for _, s := range []string{"61 * * * *", "* * * *", "0 25 * * *", "TZ=UTC 0 2 * * *", "@fortnightly", ""} {
		if _, err := ParseSchedule(s); err == nil {
			t.Errorf("ParseSchedule(%q) accepted", s)
		}
	}
	last := time.Date(2025, 3, 10, 2, 30, 0, 0, time.UTC)
	cases := []struct {
		sched string
		want  time.Time
	}{
		{"0 3 * * *", time.Date(2025, 3, 10, 3, 0, 0, 0, time.UTC)},
		{"0 2 * * *", time.Date(2025, 3, 11, 2, 0, 0, 0, time.UTC)},
		{"@hourly", time.Date(2025, 3, 10, 3, 0, 0, 0, time.UTC)},
		{"*/10 * * * *", time.Date(2025, 3, 10, 2, 40, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		got, err := NextRun(c.sched, last)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("NextRun(%q) = %v, %v; want %v", c.sched, got, err, c.want)
		}
	}
	if _, err := NextRun("0 0 30 2 *", last); err == nil {
		t.Errorf("a schedule that never fires (30 February) was accepted")
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 80) + "-db"
	names := map[string]string{
		"cronjob":      CronJobName("db"),
		"cronjob long": CronJobName(long),
		"now":          BackupNowJobName("db", "2025-01-01T00:00:00Z"),
		"now long":     BackupNowJobName(long, "x"),
		"restore":      RestoreJobName("r1"),
		"restore long": RestoreJobName(long),
		"service":      WorkerServiceName("ssd", "node-1"),
		"service long": WorkerServiceName("ssd", strings.Repeat("n", 70)),
		"service odd":  WorkerServiceName("hdd", "Node_7.example.com"),
	}
	max := map[string]int{"cronjob": 52, "cronjob long": 52}
	for k, n := range names {
		limit := 63
		if m, ok := max[k]; ok {
			limit = m
		}
		if len(n) > limit {
			t.Errorf("%s: %q is %d characters (max %d)", k, n, len(n), limit)
		}
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%s: %q: %v", k, n, errs)
		}
	}
	if CronJobName("db") != "db-backup" || RestoreJobName("r1") != "r1-restore" ||
		WorkerServiceName("ssd", "node-1") != "revault-worker-ssd-node-1" {
		t.Errorf("short names should be readable: %v", names)
	}
	if BackupNowJobName("db", "a") == BackupNowJobName("db", "b") {
		t.Errorf("two backup-now requests map to the same Job name")
	}
	if CronJobName(long) == CronJobName(long+"x") {
		t.Errorf("shortened names collide")
	}
	if WorkerServiceName("hdd", "Node_7.example.com") == WorkerServiceName("hdd", "node-7-example-com") {
		t.Errorf("a node name that needed cleaning collides with the cleaned one")
	}
}

func TestLabelValue(t *testing.T) {
	cases := []string{"db", "node-1.example.com", strings.Repeat("x", 63), strings.Repeat("x", 64),
		"a/b", "-lead", "trail-", "ünïcode", ""}
	for _, s := range cases {
		v := LabelValue(s)
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("LabelValue(%q) = %q: %v", s, v, errs)
		}
		if len(validation.IsValidLabelValue(s)) == 0 && v != s {
			t.Errorf("LabelValue(%q) = %q: a valid value must stay as it is", s, v)
		}
	}
	if LabelValue(strings.Repeat("x", 64)) == LabelValue(strings.Repeat("x", 65)) {
		t.Errorf("long values collide")
	}
}

// Outputs as `revault push|pull --json --quiet` print them (pretty JSON on stdout, the error
// line on stderr), possibly interleaved in a pod log.
const pullOK = `{
  "bytes": 403456,
  "kind": "tree",
  "output": "/data/",
  "seconds": 0.25,
  "series": "ns/db",
  "server": {
    "bytesRead": 400000,
    "containerReads": 2,
    "logicalBytes": 400000,
    "speedFactor": 0.19,
    "state": "done",
    "warnings": []
  },
  "version": 1
}
`

const pullFailed = `{
  "error": {
    "code": "unknown_version",
    "message": "series ns/db has no version 7 (latest is 1)"
  }
}
error: series ns/db has no version 7 (latest is 1)
`

func TestParseJobOutput(t *testing.T) {
	cases := []struct {
		name, text, reportSeries, err string
	}{
		{"pretty report", pullOK, "ns/db", ""},
		{"one-line report after noise", "pulling...\n{\"series\":\"a/b\",\"version\":1}\n", "a/b", ""},
		{"report with CRLF", strings.ReplaceAll(pullOK, "\n", "\r\n"), "ns/db", ""},
		{"pretty error then error line", pullFailed, "", "series ns/db has no version 7 (latest is 1)"},
		{"pretty error only (stderr lost)", strings.SplitAfter(pullFailed, "}\n}\n")[0], "", "series ns/db has no version 7 (latest is 1)"},
		{"error line only", "error: invalid bearer token\n", "", "invalid bearer token"},
		{"crash text", "thread 'main' panicked at src/x.rs:1\nnote: run with RUST_BACKTRACE=1\n", "", "note: run with RUST_BACKTRACE=1"},
		{"a report cut at the front (log tail) is not a report", pullOK[40:], "", "}"},
		{"empty", "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := ParseJobOutput(c.text)
			if out.Error != c.err {
				t.Fatalf("error %q, want %q", out.Error, c.err)
			}
			if c.reportSeries == "" {
				if out.Report != nil {
					t.Fatalf("unexpected report %s", out.Report)
				}
				return
			}
			r, err := ParsePullReport(out.Report)
			if err != nil || r.Series != c.reportSeries {
				t.Fatalf("report %s: %+v, %v", out.Report, r, err)
			}
		})
	}
	r, err := ParsePullReport(ParseJobOutput(pullOK).Report)
	if err != nil || r.Bytes != 403456 || r.RestoredBytes() != 400000 || r.Server.ContainerReads != 2 ||
		*r.Server.SpeedFactor != 0.19 || r.Seconds != 0.25 || *r.Version != 1 {
		t.Fatalf("ParsePullReport = %+v, %v", r, err)
	}
	r, _ = ParsePullReport([]byte(`{"series":"a/b","bytes":5,"server":null}`))
	if r.RestoredBytes() != 5 {
		t.Fatalf("without the worker's report the client's count is used: %d", r.RestoredBytes())
	}
}

func TestParsePushReport(t *testing.T) {
	out := ParseJobOutput("{\n  \"logicalBytes\": 524288,\n  \"newBytes\": 4096,\n  \"series\": \"ns/db\",\n  \"version\": 3\n}\n")
	r, err := ParsePushReport(out.Report)
	if err != nil || r.Version == nil || *r.Version != 3 || r.LogicalBytes != 524288 || r.NewBytes != 4096 {
		t.Fatalf("ParsePushReport = %+v, %v", r, err)
	}
	// No report at all (the pod printed none) is an error, not a version-less success.
	if _, err := ParsePushReport(ParseJobOutput("error: disk full\n").Report); err == nil {
		t.Fatalf("a missing report parsed")
	}
}

func TestFormat(t *testing.T) {
	if got := Ratio(742, 100); got != "7.42" {
		t.Errorf("Ratio = %q", got)
	}
	if got := Ratio(1, 0); got != "" {
		t.Errorf("Ratio by zero = %q", got)
	}
	if got := Throughput(412.3 * 1024 * 1024); got != "412.3 MiB/s" {
		t.Errorf("Throughput = %q", got)
	}
	if got := Throughput(512); got != "512.0 B/s" {
		t.Errorf("Throughput = %q", got)
	}
	for _, c := range []struct {
		done, total int64
		want        string
	}{{0, 100, "0%"}, {37, 100, "37%"}, {200, 100, "100%"}, {0, 0, "0%"}, {5, 0, "100%"}} {
		if got := Percent(c.done, c.total); got != c.want {
			t.Errorf("Percent(%d, %d) = %q, want %q", c.done, c.total, got, c.want)
		}
	}
	for _, c := range []struct{ bytes, want int64 }{{1, 1}, {1 << 20, 1}, {1<<20 + 1, 2}, {64 << 20, 64}, {0, 1}} {
		if got := CacheMiB(c.bytes); got != c.want {
			t.Errorf("CacheMiB(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
}

const gib = int64(1 << 30)

// room is a worker whose containers and metadata share one filesystem with free of total.
func room(free, total int64) *Room {
	return &Room{DataTotal: total, DataFree: free, MetaTotal: total, MetaFree: free, MinFreePercent: DefaultMinFreePercent}
}

func TestNearlyFullSaysWhy(t *testing.T) {
	c := Candidate{Room: &Room{DataTotal: 200 << 30, DataFree: 10 << 30, MetaTotal: 1, MetaFree: 1, MinFreePercent: 10}}
	if got, want := c.NearlyFull(), "5% free for containers of 200.0 GiB (new series need 10%)"; got != want {
		t.Fatalf("NearlyFull = %q; want %q", got, want)
	}
	if got := (Candidate{}).NearlyFull(); got != "" {
		t.Fatalf("a worker that does not report its room: %q", got)
	}
	c.Room.MinFreePercent = 0
	if got := c.NearlyFull(); got != "" {
		t.Fatalf("with the check off (0%%), a worker with 5%% free is not nearly full: %q", got)
	}
	c.Room.MinFreePercent, c.Room.DataFree = 3, 0
	if got, want := c.NearlyFull(), "0% free for containers of 200.0 GiB (new series need 3%)"; got != want {
		t.Fatalf("NearlyFull = %q; want %q", got, want)
	}
	// A degraded store (full metadata disk) takes no new series even with the check off, and
	// even when it reports no sizes.
	c.Room.MinFreePercent, c.Room.DataFree, c.Room.Degraded = 0, 100<<30, "a synced write failed"
	if got, want := c.NearlyFull(), "a degraded store (a synced write failed)"; got != want {
		t.Fatalf("NearlyFull = %q; want %q", got, want)
	}
	if got := (Candidate{Room: &Room{Degraded: "x"}}).NearlyFull(); got == "" {
		t.Fatal("a degraded store that reports no sizes is not nearly full")
	}
}
