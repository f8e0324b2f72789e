package controller

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// checkSchedule sets ScheduleValid. The CRD checks the schedule's shape; the cron parser catches
// the rest (an impossible minute), and no CronJob is made for a schedule it rejects.
func (r *BackupSeriesReconciler) checkSchedule(_ context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	s.scheduleOK = true
	if bs.Spec.Schedule == "" {
		s.cs.setTrue(backupv1alpha1.ConditionScheduleValid, "OnDemand", "no schedule: backups run on the revault.io/backup-now annotation")
	} else if _, perr := plan.ParseSchedule(bs.Spec.Schedule); perr != nil {
		s.scheduleOK = false
		s.cs.setFalse(backupv1alpha1.ConditionScheduleValid, "InvalidSchedule", perr.Error())
	} else {
		s.cs.setTrue(backupv1alpha1.ConditionScheduleValid, "Scheduled", "backups run on "+bs.Spec.Schedule)
	}
	return proceed()
}

// schedule keeps the CronJob of scheduled backups, which exists only for a PVC series with a
// valid schedule.
func (r *BackupSeriesReconciler) schedule(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	if err := r.reconcileCronJob(ctx, s.bs, s.bs.Status.Worker.Endpoint, s.scheduleOK); err != nil {
		return failed(err)
	}
	return proceed()
}

// reconcileCronJob applies the series' CronJob when it should have one (scheduleOK: its schedule
// parses), and otherwise deletes the CronJob of that name if the series owns it.
func (r *BackupSeriesReconciler) reconcileCronJob(ctx context.Context, bs *backupv1alpha1.BackupSeries, endpoint string, scheduleOK bool) error {
	want := bs.Spec.Source.PVC != nil && bs.Spec.Schedule != "" && scheduleOK
	cj := plan.BackupCronJob(r.Config, bs, endpoint)
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
