package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/pkg/workerclient"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// applyAll applies the policy to every live series that references it, in name order, and
// records each one's entry in status.series. A series is slid and expired when the rules changed
// since they were last applied to it, or when a scheduled expiry is due.
func (r *RetentionPolicyReconciler) applyAll(ctx context.Context, p *policyRun) (ctrl.Result, bool, error) {
	rp := p.rp
	var series backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &series, client.InNamespace(rp.Namespace), client.MatchingFields{indexRetentionRef: rp.Name}); err != nil {
		return failed(err)
	}
	sort.Slice(series.Items, func(i, j int) bool { return series.Items[i].Name < series.Items[j].Name })
	wr := Rules(rp.Spec)

	prev := map[string]backupv1alpha1.SeriesRetentionStatus{}
	for _, s := range rp.Status.Series {
		prev[s.Name] = s
	}
	var entries []backupv1alpha1.SeriesRetentionStatus
	for i := range series.Items {
		bs := &series.Items[i]
		if !bs.DeletionTimestamp.IsZero() {
			continue
		}
		e := seriesEntry(prev, bs)
		if bs.Status.Worker == nil {
			e.Message = "waiting for the series to be placed on a worker"
			p.waiting = append(p.waiting, bs.Name)
			entries = append(entries, e)
			continue
		}
		changed := e.AppliedGeneration != rp.Generation
		did, err := r.applyToSeries(ctx, rp, bs, &e, wr, changed || p.due)
		p.ran = p.ran || did
		if err != nil {
			p.o.workerFailed = true
			e.Message = err.Error()
			p.failures = append(p.failures, fmt.Sprintf("%s: %v", bs.Name, err))
		} else {
			e.Message = ""
			e.AppliedGeneration = rp.Generation
		}
		entries = append(entries, e)
	}
	rp.Status.Series = entries
	rp.Status.SeriesCount = int32(len(entries))
	return proceed()
}

// seriesEntry is the series' entry of status.series as it was, or a fresh one for a series that
// is new to the policy. A new series under an old name starts from scratch too.
func seriesEntry(prev map[string]backupv1alpha1.SeriesRetentionStatus, bs *backupv1alpha1.BackupSeries) backupv1alpha1.SeriesRetentionStatus {
	e := prev[bs.Name]
	if e.UID != string(bs.UID) {
		e = backupv1alpha1.SeriesRetentionStatus{UID: string(bs.UID)}
	}
	e.Name = bs.Name
	return e
}

// applyToSeries pushes the rules to the series' worker when they changed, or when the worker's
// differ from them (a series controller that saw the policy gone cleared them, or the series was
// recovered elsewhere), then (if run) slides and expires, and records what is still pending, as
// the worker plans it. It reports whether it slid and expired.
func (r *RetentionPolicyReconciler) applyToSeries(ctx context.Context, rp *backupv1alpha1.RetentionPolicy,
	bs *backupv1alpha1.BackupSeries, e *backupv1alpha1.SeriesRetentionStatus,
	wr workerclient.Retention, run bool) (bool, error) {
	w := bs.Status.Worker
	api, err := r.Workers.API(ctx, w.Media, w.Node)
	if err != nil {
		return false, err
	}
	s, err := api.Series(ctx, bs.Namespace, bs.Name)
	if err != nil && !workerclient.IsNotFound(err) {
		return false, err
	}
	drifted := s != nil && !sameRules(s.Retention, wr)
	if e.AppliedGeneration != rp.Generation || drifted || run {
		// The series list came from the cache: a series that dropped this policy a moment ago
		// (its rules cleared, or another policy's pushed) must not get these back, nor be expired
		// by them.
		still, err := r.stillUses(ctx, rp, bs)
		if err != nil || !still {
			return false, err
		}
	}
	if e.AppliedGeneration != rp.Generation || drifted {
		if err := api.PutRetention(ctx, bs.Namespace, bs.Name, wr); err != nil {
			return false, fmt.Errorf("storing the retention: %w", err)
		}
		r.Recorder.Eventf(rp, "Normal", "RetentionStored", "series %s: keep %s, live %d",
			bs.Name, describeKeep(rp.Spec), *wr.Live)
	}
	if run {
		if err := r.slideAndExpire(ctx, api, rp, bs, e); err != nil {
			return false, err
		}
		s, err = api.Series(ctx, bs.Namespace, bs.Name)
		if err != nil && !workerclient.IsNotFound(err) {
			return run, err
		}
	}
	e.PendingExpiry = nil
	if s != nil {
		e.PendingExpiry = nonEmpty(s.PendingExpiry)
	}
	return run, nil
}

// stillUses reads the series uncached and reports whether it is the same series and still
// references the policy.
func (r *RetentionPolicyReconciler) stillUses(ctx context.Context, rp *backupv1alpha1.RetentionPolicy, bs *backupv1alpha1.BackupSeries) (bool, error) {
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	cur := &backupv1alpha1.BackupSeries{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(bs), cur); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	ref := cur.Spec.RetentionPolicyRef
	return cur.UID == bs.UID && cur.DeletionTimestamp.IsZero() && ref != nil && ref.Name == rp.Name, nil
}

// sameRules: the worker's stored retention is the one the policy wants. An absent keep-within
// rule and a zero one are the same rule, as are no time zone and an empty one.
func sameRules(have workerclient.RetentionState, want workerclient.Retention) bool {
	eq := func(a, b *int64) bool { return ptr.Deref(a, 0) == ptr.Deref(b, 0) && (a == nil) == (b == nil) }
	return eq(have.Keep, want.Keep) && ptr.Deref(have.KeepWithinSeconds, 0) == ptr.Deref(want.KeepWithinSeconds, 0) &&
		eq(have.KeepHourly, want.KeepHourly) && eq(have.KeepDaily, want.KeepDaily) &&
		eq(have.KeepWeekly, want.KeepWeekly) && eq(have.KeepMonthly, want.KeepMonthly) &&
		eq(have.KeepYearly, want.KeepYearly) && ptr.Deref(have.Timezone, "") == ptr.Deref(want.Timezone, "") &&
		have.Live == ptr.Deref(want.Live, 1) && have.Auto == ptr.Deref(want.Auto, true)
}

// slideAndExpire slides the versions that left the live window (their recipes become archival)
// and expires those the rules no longer keep; a series the worker does not know yet has nothing
// to do. It records what that did and freed in e and in the policy's total.
func (r *RetentionPolicyReconciler) slideAndExpire(ctx context.Context, api *instrumented, rp *backupv1alpha1.RetentionPolicy,
	bs *backupv1alpha1.BackupSeries, e *backupv1alpha1.SeriesRetentionStatus) error {
	slid, err := api.Slide(ctx, bs.Namespace, bs.Name)
	if err != nil && !workerclient.IsNotFound(err) {
		return fmt.Errorf("slide: %w", err)
	}
	exp, err := api.ExpireByRetention(ctx, bs.Namespace, bs.Name)
	if err != nil && !workerclient.IsNotFound(err) {
		return fmt.Errorf("expire: %w", err)
	}
	var freed int64
	e.LastSlid, e.LastExpired = nil, nil
	if slid != nil {
		e.LastSlid = nonEmpty(slid.Slid)
		freed += slid.BytesFreed
	}
	if exp != nil {
		e.LastExpired = nonEmpty(exp.Expired)
		freed += exp.BytesFreed
	}
	e.BytesReclaimed += freed
	rp.Status.BytesReclaimed += freed
	metrics.BytesReclaimed.Add(float64(freed))
	if len(e.LastExpired) > 0 || len(e.LastSlid) > 0 || freed > 0 {
		r.Recorder.Eventf(rp, "Normal", "Expired", "series %s: expired versions %v, slid %v, %d bytes reclaimed",
			bs.Name, e.LastExpired, e.LastSlid, freed)
	}
	return nil
}

// nonEmpty is vs, or nil when it holds nothing: the status lists are omitempty, and an empty
// list the worker sent must compare equal to the one read back from the API server.
func nonEmpty(vs []int64) []int64 {
	if len(vs) == 0 {
		return nil
	}
	return vs
}

// describeKeep says in words which versions the policy keeps, for events.
func describeKeep(s backupv1alpha1.RetentionPolicySpec) string {
	var parts []string
	if s.KeepVersions != nil {
		parts = append(parts, fmt.Sprintf("the newest %d versions", *s.KeepVersions))
	}
	if s.KeepWithin != nil {
		parts = append(parts, "versions within "+s.KeepWithin.Duration.String()+" of the newest")
	}
	for _, c := range []struct {
		n      *int32
		period string
	}{{s.KeepHourly, "hours"}, {s.KeepDaily, "days"}, {s.KeepWeekly, "weeks"}, {s.KeepMonthly, "months"}, {s.KeepYearly, "years"}} {
		if c.n != nil {
			parts = append(parts, fmt.Sprintf("the newest of each of the last %d %s", *c.n, c.period))
		}
	}
	if s.TimeZone != nil && *s.TimeZone != "" {
		parts = append(parts, "(in "+*s.TimeZone+")")
	}
	return strings.Join(parts, " and ")
}
