package plan

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// ParseSchedule checks a cron schedule the way the CronJob controller reads it (five fields or
// a @descriptor). The CRDs check the shape with a regular expression; this catches what a
// regular expression cannot, such as "61 * * * *".
func ParseSchedule(s string) (cron.Schedule, error) {
	if strings.Contains(s, "TZ=") {
		return nil, fmt.Errorf("schedule %q: time zones in the schedule are not supported", s)
	}
	sched, err := cron.ParseStandard(s)
	if err != nil {
		return nil, fmt.Errorf("schedule %q is not a valid cron schedule: %v", s, err)
	}
	return sched, nil
}

// NextRun is the first time the schedule fires strictly after last. A policy that never ran
// uses its creation time as last, so a new policy waits for its first slot.
func NextRun(s string, last time.Time) (time.Time, error) {
	sched, err := ParseSchedule(s)
	if err != nil {
		return time.Time{}, err
	}
	next := sched.Next(last)
	if next.IsZero() {
		return time.Time{}, fmt.Errorf("schedule %q never fires", s)
	}
	return next, nil
}

// Zone is the location a schedule counts in: the IANA zone tz, UTC when unset.
func Zone(tz *string) (*time.Location, error) {
	if tz == nil || *tz == "" {
		return time.UTC, nil
	}
	// "Local" is the operator's own zone, which the CronJob controller refuses.
	loc, err := time.LoadLocation(*tz)
	if err != nil || strings.EqualFold(*tz, "Local") {
		return nil, fmt.Errorf("timeZone %q is not a known IANA time zone", *tz)
	}
	return loc, nil
}

// NextRunIn is the first time the schedule, read in loc, fires strictly after last.
func NextRunIn(s string, loc *time.Location, last time.Time) (time.Time, error) {
	return NextRun(s, last.In(loc))
}

// BackupDeadline is when a scheduled series whose newest backup is from since becomes overdue:
// once the second scheduled run after since has had half an interval (the gap between those two
// runs) to finish without a new backup — about two days for a daily schedule. One failed or
// missed run is not yet overdue; counting in runs rather than hours keeps a weekday schedule
// from being overdue every weekend.
func BackupDeadline(s string, loc *time.Location, since time.Time) (time.Time, error) {
	first, err := NextRunIn(s, loc, since)
	if err != nil {
		return time.Time{}, err
	}
	second, err := NextRunIn(s, loc, first)
	if err != nil {
		return time.Time{}, err
	}
	// When clocks go back, a daily 02:00 fires at 02:00 twice, an hour apart: one run, not two.
	if wallClock(second, loc) == wallClock(first, loc) {
		if second, err = NextRunIn(s, loc, second); err != nil {
			return time.Time{}, err
		}
	}
	return second.Add(second.Sub(first) / 2), nil
}

// wallClock is t's date and minute on the clocks of loc.
func wallClock(t time.Time, loc *time.Location) string {
	return t.In(loc).Format("2006-01-02 15:04")
}
