package controller

import (
	"time"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// nextExpiry is when the policy's expiry schedule fires next: after its last expiry, or after its
// creation when it never ran (so a new policy waits for its first slot).
func nextExpiry(rp *backupv1alpha1.RetentionPolicy) (time.Time, error) {
	last := rp.CreationTimestamp.Time
	if rp.Status.LastExpiryTime != nil {
		last = rp.Status.LastExpiryTime.Time
	}
	return plan.NextRun(rp.Spec.ExpirySchedule, last)
}
