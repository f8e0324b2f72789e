package plan

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func at(t *testing.T, loc *time.Location, s string) time.Time {
	t.Helper()
	v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestZone(t *testing.T) {
	if loc, err := Zone(nil); err != nil || loc != time.UTC {
		t.Fatalf("unset zone: %v %v", loc, err)
	}
	if loc, err := Zone(ptr.To("Europe/Berlin")); err != nil || loc.String() != "Europe/Berlin" {
		t.Fatalf("Europe/Berlin: %v %v", loc, err)
	}
	if _, err := Zone(ptr.To("Local")); err == nil {
		t.Fatal("Local is the operator's zone, which a CronJob refuses")
	}
	_, err := Zone(ptr.To("Mars/Olympus_Mons"))
	if err == nil || err.Error() != `timeZone "Mars/Olympus_Mons" is not a known IANA time zone` {
		t.Fatalf("unknown zone: %v", err)
	}
}

func TestNextRunInCountsInTheZone(t *testing.T) {
	berlin, err := Zone(ptr.To("Europe/Berlin"))
	if err != nil {
		t.Fatal(err)
	}
	// 02:00 in Berlin is 01:00 UTC in winter and 00:00 UTC in summer.
	for _, c := range []struct{ after, want string }{
		{"2026-01-10 12:00", "2026-01-11 01:00"},
		{"2026-07-10 12:00", "2026-07-11 00:00"},
	} {
		got, err := NextRunIn("0 2 * * *", berlin, at(t, time.UTC, c.after))
		if err != nil {
			t.Fatal(err)
		}
		if want := at(t, time.UTC, c.want); !got.Equal(want) {
			t.Errorf("after %s UTC: next run %s, want %s UTC", c.after, got.UTC(), want)
		}
	}
}

func TestBackupDeadline(t *testing.T) {
	for _, c := range []struct {
		name, schedule, since, want string
	}{
		// Runs Tue 02:00 and Wed 02:00 pass without a backup; Wed's had 12 h.
		{"daily", "0 2 * * *", "2026-11-23 02:05", "2026-11-25 14:00"},
		// Friday's backup is not overdue over the weekend: Mon and Tue must both miss.
		{"weekdays", "0 2 * * 1-5", "2026-11-27 02:05", "2026-12-01 14:00"},
		{"hourly", "@hourly", "2026-11-23 10:05", "2026-11-23 12:30"},
	} {
		got, err := BackupDeadline(c.schedule, time.UTC, at(t, time.UTC, c.since))
		if err != nil {
			t.Fatal(err)
		}
		if want := at(t, time.UTC, c.want); !got.Equal(want) {
			t.Errorf("%s: deadline %s, want %s", c.name, got, want)
		}
	}
	// 2026-10-25 in Berlin: 02:00 CEST and 02:00 CET are one run on the clock, not two.
	berlin, err := Zone(ptr.To("Europe/Berlin"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := BackupDeadline("0 2 * * *", berlin, at(t, berlin, "2026-10-24 02:05"))
	if err != nil {
		t.Fatal(err)
	}
	// Runs 10-25 02:00 (CEST or CET) and 10-26 02:00 CET; half a day (12.5 h across the change) after the second.
	if want := at(t, berlin, "2026-10-26 14:00"); got.Sub(want).Abs() > time.Hour {
		t.Errorf("across the change: deadline %s, want about %s", got, want)
	}
	if _, err := BackupDeadline("0 0 30 2 *", time.UTC, at(t, time.UTC, "2026-01-01 00:00")); err == nil {
		t.Error("a schedule that never fires has no deadline")
	}
}
