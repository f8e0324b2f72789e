package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/metrics"
)

// finishStatus sets the phase (with an event when it changes), Ready and observedGeneration.
func (r *BackupSeriesReconciler) finishStatus(bs *backupv1alpha1.BackupSeries, phase backupv1alpha1.BackupSeriesPhase) {
	st := &bs.Status
	if st.Phase != phase {
		if st.Phase != "" {
			r.Recorder.Eventf(bs, "Normal", "Phase"+string(phase), "phase %s -> %s", st.Phase, phase)
		}
		st.Phase = phase
	}
	r.Phases.Set(types.NamespacedName{Namespace: bs.Namespace, Name: bs.Name}.String(), string(phase))
	st.ObservedGeneration = bs.Generation
	cs := conditionSetter{rec: r.Recorder, obj: bs, conds: &st.Conditions, generation: bs.Generation}
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

func (r *BackupSeriesReconciler) writeStatus(ctx context.Context, bs *backupv1alpha1.BackupSeries, orig *backupv1alpha1.BackupSeriesStatus) error {
	if equality.Semantic.DeepEqual(orig, &bs.Status) {
		return nil
	}
	if err := r.Status().Update(ctx, bs); err != nil {
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
