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
