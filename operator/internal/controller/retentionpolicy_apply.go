package controller

import (
	"context"
	"fmt"
	"strings"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/workerapi"
)

// applyToSeries pushes the rules to the series' worker when they changed, then (if run) slides
// and expires, and records what is still pending. It reports whether it slid and expired.
func (r *RetentionPolicyReconciler) applyToSeries(ctx context.Context, rp *backupv1alpha1.RetentionPolicy,
	bs *backupv1alpha1.BackupSeries, e *backupv1alpha1.SeriesRetentionStatus,
	wr workerapi.Retention, rules plan.RetentionRules, run bool) (bool, error) {
	w := bs.Status.Worker
	api, err := r.Workers.API(ctx, w.Media, w.Node)
	if err != nil {
		return false, err
	}
	if e.AppliedGeneration != rp.Generation {
		if _, err := api.PutRetention(ctx, bs.Namespace, bs.Name, wr); err != nil {
			return false, fmt.Errorf("storing the retention: %w", err)
		}
		r.Recorder.Eventf(rp, "Normal", "RetentionStored", "series %s: keep %s, live %d",
			bs.Name, describeKeep(rp.Spec), wr.Live)
	}
	ran := false
	if run {
		slid, err := api.Slide(ctx, bs.Namespace, bs.Name)
		if err != nil && !workerapi.IsNotFound(err) {
			return false, fmt.Errorf("slide: %w", err)
		}
		exp, err := api.ExpireByRetention(ctx, bs.Namespace, bs.Name)
		if err != nil && !workerapi.IsNotFound(err) {
			return false, fmt.Errorf("expire: %w", err)
		}
		ran = true
		var freed int64
		e.LastSlid, e.LastExpired = nil, nil
		if slid != nil {
			e.LastSlid = slid.Slid
			freed += slid.BytesFreed
		}
		if exp != nil {
			e.LastExpired = exp.Expired
			freed += exp.BytesFreed
		}
		e.BytesReclaimed += freed
		rp.Status.BytesReclaimed += freed
		metrics.BytesReclaimed.Add(float64(freed))
		if len(e.LastExpired) > 0 || len(e.LastSlid) > 0 || freed > 0 {
			r.Recorder.Eventf(rp, "Normal", "Expired", "series %s: expired versions %v, slid %v, %d bytes reclaimed",
				bs.Name, e.LastExpired, e.LastSlid, freed)
		}
	}
	s, err := api.Series(ctx, bs.Namespace, bs.Name)
	switch {
	case workerapi.IsNotFound(err):
		e.PendingExpiry = nil
	case err != nil:
		return ran, err
	default:
		e.PendingExpiry = plan.Expiring(versionsAt(s), rules)
	}
	return ran, nil
}

func describeKeep(s backupv1alpha1.RetentionPolicySpec) string {
	var parts []string
	if s.KeepVersions != nil {
		parts = append(parts, fmt.Sprintf("the newest %d versions", *s.KeepVersions))
	}
	if s.KeepWithin != nil {
		parts = append(parts, "versions within "+s.KeepWithin.Duration.String()+" of the newest")
	}
	return strings.Join(parts, " and ")
}
