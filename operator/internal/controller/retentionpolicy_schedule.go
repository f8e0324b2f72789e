package controller

import (
	"context"
	"time"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
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

// checkSchedule sets Scheduled and finds out whether a scheduled expiry is due. Without an expiry
// schedule the worker applies the policy after every backup.
func (r *RetentionPolicyReconciler) checkSchedule(_ context.Context, p *policyRun) (ctrl.Result, bool, error) {
	rp := p.rp
	if rp.Spec.ExpirySchedule == "" {
		p.cs.setTrue(backupv1alpha1.ConditionScheduled, "AfterEveryBackup", "no expirySchedule: the worker applies the policy after every backup")
		return proceed()
	}
	n, err := nextExpiry(rp)
	if err != nil {
		p.cs.setFalse(backupv1alpha1.ConditionScheduled, "InvalidSchedule", err.Error())
		return proceed()
	}
	p.next, p.due = n, !p.now.Before(n)
	p.cs.setTrue(backupv1alpha1.ConditionScheduled, "Scheduled", "expiry runs on "+rp.Spec.ExpirySchedule)
	return proceed()
}

// recordRun stamps the slide and expiry that ran and sets when the next scheduled one fires,
// counted from the (possibly just updated) last expiry; the policy is looked at again then. A
// scheduled run that failed somewhere is not stamped, so it is retried (slide and expire are
// idempotent).
func (r *RetentionPolicyReconciler) recordRun(_ context.Context, p *policyRun) (ctrl.Result, bool, error) {
	st := &p.rp.Status
	if p.ran && (!p.due || len(p.failures) == 0) {
		t := metav1.NewTime(p.now)
		st.LastSlideTime, st.LastExpiryTime = &t, &t
	}
	st.NextExpiryTime = nil
	if p.next.IsZero() {
		return proceed()
	}
	if n, err := nextExpiry(p.rp); err == nil {
		nt := metav1.NewTime(n)
		st.NextExpiryTime = &nt
		if d := n.Sub(p.now); d < p.requeue {
			p.requeue = max(d, time.Second)
		}
	}
	return proceed()
}
