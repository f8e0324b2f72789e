package controller

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// checkSchedule sets ScheduleValid. The CRD checks the schedule's shape; the cron parser catches
// the rest (an impossible minute), the time zone database an unknown zone, and no CronJob is made
// for a schedule either rejects.
func (r *BackupSeriesReconciler) checkSchedule(_ context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	s.scheduleOK = true
	if bs.Spec.Schedule == "" {
		s.cs.setTrue(backupv1alpha1.ConditionScheduleValid, "OnDemand", "no schedule: backups run on the revault.io/backup-now annotation")
		return proceed()
	}
	loc, err := plan.Zone(bs.Spec.TimeZone)
	if err != nil {
		s.scheduleOK = false
		s.cs.setFalse(backupv1alpha1.ConditionScheduleValid, "UnknownTimeZone", err.Error())
		return proceed()
	}
	// A schedule that never fires ("0 0 30 2 *") parses, but has no next run.
	next, err := plan.NextRunIn(bs.Spec.Schedule, loc, r.Now())
	if err != nil {
		s.scheduleOK = false
		s.cs.setFalse(backupv1alpha1.ConditionScheduleValid, "InvalidSchedule", err.Error())
		return proceed()
	}
	s.zone, s.next = loc, next
	s.cs.setTrue(backupv1alpha1.ConditionScheduleValid, "Scheduled", fmt.Sprintf("backups run on %s (%s)", bs.Spec.Schedule, loc))
	return proceed()
}

// checkOverdue sets nextBackup and BackupOverdue for a series whose valid schedule is active,
// and looks again when either changes; other series have neither. A series without any backup
// counts from its creation.
func (r *BackupSeriesReconciler) checkOverdue(_ context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs, st := s.bs, &s.bs.Status
	// A schedule suspended for the namespace's quota is not overdue either: QuotaExceeded says
	// why. One held by a move is: a move that cannot finish must not hide that backups stopped.
	if bs.Spec.Schedule == "" || !s.scheduleOK || bs.Spec.Suspend || s.overQuota || bs.Spec.Source.PVC == nil {
		st.NextBackup = nil
		apimeta.RemoveStatusCondition(&st.Conditions, backupv1alpha1.ConditionBackupOverdue)
		return proceed()
	}
	now, next := r.Now(), s.next
	st.NextBackup = &metav1.Time{Time: next.UTC().Truncate(time.Second)}
	since, what := bs.CreationTimestamp.Time, "since the series was created"
	if st.LastBackup != nil {
		since, what = st.LastBackup.Time, "since version "+fmt.Sprint(st.LatestVersion)
	}
	deadline, err := plan.BackupDeadline(bs.Spec.Schedule, s.zone, since)
	if err != nil {
		return proceed()
	}
	stamp := func(t time.Time) string { return t.In(s.zone).Format(time.RFC3339) }
	if now.Before(deadline) {
		s.cs.setFalse(backupv1alpha1.ConditionBackupOverdue, "OnSchedule", fmt.Sprintf(
			"newest backup %s at %s; overdue from %s if no backup succeeds by then", what, stamp(since), stamp(deadline)))
		s.requeue = min(s.requeue, deadline.Sub(now)+time.Second)
	} else {
		s.cs.setTrue(backupv1alpha1.ConditionBackupOverdue, "NoRecentBackup", fmt.Sprintf(
			"no backup succeeded %s at %s: two runs of schedule %q (%s) have passed without one",
			what, stamp(since), bs.Spec.Schedule, s.zone))
	}
	s.requeue = min(s.requeue, next.Sub(now)+time.Second)
	return proceed()
}

// schedule keeps the CronJob of scheduled backups, which exists only for a PVC series with a
// valid schedule.
func (r *BackupSeriesReconciler) schedule(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	if err := r.reconcileCronJob(ctx, s.bs, s.bs.Status.Worker.Endpoint, s.scheduleOK, s.overQuota || s.moving); err != nil {
		return failed(err)
	}
	return proceed()
}

// reconcileCronJob applies the series' CronJob when it should have one (scheduleOK: its schedule
// parses), suspended while the namespace is over its quota or the series moves, and otherwise deletes the CronJob of
// that name if the series owns it.
func (r *BackupSeriesReconciler) reconcileCronJob(ctx context.Context, bs *backupv1alpha1.BackupSeries, endpoint string, scheduleOK, overQuota bool) error {
	want := bs.Spec.Source.PVC != nil && bs.Spec.Schedule != "" && scheduleOK
	cj := plan.BackupCronJob(r.Config, bs, endpoint)
	if overQuota {
		cj.Spec.Suspend = ptr.To(true)
	}
	if !want {
		existing := &batchv1.CronJob{}
		err := r.Get(ctx, client.ObjectKeyFromObject(cj), existing)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if metav1.IsControlledBy(existing, bs) {
			r.Recorder.Event(bs, "Normal", "ScheduleRemoved", "deleted CronJob "+existing.Name)
			return client.IgnoreNotFound(r.Delete(ctx, existing, client.PropagationPolicy(metav1.DeletePropagationBackground)))
		}
		return nil
	}
	if err := controllerutil.SetControllerReference(bs, cj, r.Scheme); err != nil {
		return err
	}
	existing := &batchv1.CronJob{}
	err := r.Get(ctx, client.ObjectKeyFromObject(cj), existing)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := apply(ctx, r.Client, r.Scheme, cj); err != nil {
		return fmt.Errorf("cronjob %s: %w", cj.Name, err)
	}
	if apierrors.IsNotFound(err) {
		r.Recorder.Eventf(bs, "Normal", "ScheduleCreated", "CronJob %s runs backups on %q", cj.Name, bs.Spec.Schedule)
	}
	return nil
}
