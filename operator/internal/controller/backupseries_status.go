package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/metrics"
)

// finish sets the phase from the backup Jobs (backing up while one runs, failed when the last one
// failed), then Ready, and writes the status if it changed. A series with a running Job is looked
// at again soon, to follow it.
func (r *BackupSeriesReconciler) finish(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	phase := backupv1alpha1.SeriesReady
	switch {
	case s.active > 0:
		phase = r.backingUpPhase(ctx, s)
	case s.moving:
		phase = backupv1alpha1.SeriesMoving
	case st.LastJob != nil && !st.LastJob.Succeeded:
		phase = backupv1alpha1.SeriesFailed
	}
	r.finishStatus(s, phase)
	if s.active > 0 || s.moving {
		s.requeue = min(s.requeue, 10*time.Second)
	}
	return stop(ctrl.Result{RequeueAfter: s.requeue}, r.commitStatus(ctx, s))
}

// backingUpPhase is the phase of a series whose backup Job runs: Queued while its worker says
// the backup waits for a backup slot, else BackingUp (also when the Job's pod has not reached
// the worker yet). A worker that does not answer leaves Queued as it was, so the phase does not
// flap (with an event each time) while it is slow.
func (r *BackupSeriesReconciler) backingUpPhase(ctx context.Context, s *seriesRun) backupv1alpha1.BackupSeriesPhase {
	p := r.backupProgress(ctx, s)
	if (p != nil && p.Running && p.Queued) || (p == nil && s.bs.Status.Phase == backupv1alpha1.SeriesQueued) {
		return backupv1alpha1.SeriesQueued
	}
	return backupv1alpha1.SeriesBackingUp
}

// finishStatus sets the phase (with an event when it changes), Ready and observedGeneration.
func (r *BackupSeriesReconciler) finishStatus(s *seriesRun, phase backupv1alpha1.BackupSeriesPhase) {
	bs := s.bs
	st := &bs.Status
	if st.Phase != phase {
		if st.Phase != "" {
			s.events.Eventf(bs, "Normal", "Phase"+string(phase), "phase %s -> %s", st.Phase, phase)
		}
		st.Phase = phase
	}
	r.Phases.Set(types.NamespacedName{Namespace: bs.Namespace, Name: bs.Name}.String(), string(phase))
	st.ObservedGeneration = bs.Generation
	cs := s.cs
	for _, t := range []string{backupv1alpha1.ConditionPlaced, backupv1alpha1.ConditionScheduleValid,
		backupv1alpha1.ConditionTokenReady, backupv1alpha1.ConditionSynced, backupv1alpha1.ConditionBackupSucceeded} {
		if c := apimeta.FindStatusCondition(st.Conditions, t); c != nil && c.Status != metav1.ConditionTrue {
			cs.setFalse(backupv1alpha1.ConditionReady, c.Reason, c.Message)
			return
		}
	}
	if st.Worker == nil {
		cs.setFalse(backupv1alpha1.ConditionReady, "NotPlaced", "waiting for a worker")
		return
	}
	cs.setTrue(backupv1alpha1.ConditionReady, "Ready",
		fmt.Sprintf("%d versions, dedup ratio %s", st.VersionCount, orDash(st.DedupRatio)))
}

// commitStatus writes the run's status, then emits the events of its transitions; when the
// write fails they are dropped, and the retrying reconcile tells them once.
func (r *BackupSeriesReconciler) commitStatus(ctx context.Context, s *seriesRun) error {
	if err := r.writeStatus(ctx, s.bs, s.orig); err != nil {
		return err
	}
	s.events.flush()
	return nil
}

// writeStatus writes the status when it differs from orig (as read), so an idle reconcile writes
// nothing.
func (r *BackupSeriesReconciler) writeStatus(ctx context.Context, bs *backupv1alpha1.BackupSeries, orig *backupv1alpha1.BackupSeriesStatus) error {
	if equality.Semantic.DeepEqual(orig, &bs.Status) {
		return nil
	}
	if err := patchStatus(ctx, r.Client, bs, func(base *backupv1alpha1.BackupSeries) { base.Status = *orig }); err != nil {
		return err
	}
	// Count a finished backup Job once its record is stored: a conflicting
	// update is retried by a new reconcile, which would count it again.
	if j := bs.Status.LastJob; j != nil && (orig.LastJob == nil || orig.LastJob.Name != j.Name) {
		result := "succeeded"
		if !j.Succeeded {
			result = "failed"
		}
		metrics.BackupJobs.WithLabelValues(result).Inc()
	}
	return nil
}
