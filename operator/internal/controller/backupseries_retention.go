package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// checkRetentionPolicy sets RetentionPolicyFound for a series that names a RetentionPolicy (the
// RetentionPolicy controller pushes the rules to the worker); a series without one has no such
// condition.
func (r *BackupSeriesReconciler) checkRetentionPolicy(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	ref := bs.Spec.RetentionPolicyRef
	if ref == nil {
		apimeta.RemoveStatusCondition(&bs.Status.Conditions, backupv1alpha1.ConditionRetentionPolicyFound)
		return proceed()
	}
	rp := &backupv1alpha1.RetentionPolicy{}
	err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: ref.Name}, rp)
	switch {
	case apierrors.IsNotFound(err):
		s.cs.setFalse(backupv1alpha1.ConditionRetentionPolicyFound, "NotFound",
			fmt.Sprintf("RetentionPolicy %s not found in namespace %s: every version is kept", ref.Name, bs.Namespace))
	case err != nil:
		return failed(err)
	default:
		s.cs.setTrue(backupv1alpha1.ConditionRetentionPolicyFound, "Found", "RetentionPolicy "+ref.Name)
	}
	return proceed()
}

// clearRetention removes retention rules a removed RetentionPolicy left on the worker: a series
// without a RetentionPolicy keeps everything. s is the series as the worker reported it.
func (r *BackupSeriesReconciler) clearRetention(ctx context.Context, api *instrumented, bs *backupv1alpha1.BackupSeries,
	s *workerclient.SeriesDetail, cs conditionSetter) error {
	sr := s.Retention
	hasRules := sr.Keep != nil || sr.KeepWithinSeconds != nil || sr.KeepHourly != nil || sr.KeepDaily != nil ||
		sr.KeepWeekly != nil || sr.KeepMonthly != nil || sr.KeepYearly != nil
	if bs.Spec.RetentionPolicyRef != nil || !hasRules {
		return nil
	}
	// What a new series gets: every version kept, live window 1, automatic slides.
	live, auto := int64(1), true
	if err := api.PutRetention(ctx, bs.Namespace, bs.Name, workerclient.Retention{Live: &live, Auto: &auto}); err != nil {
		cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", "clearing retention: "+err.Error())
		return err
	}
	r.Recorder.Event(bs, "Normal", "RetentionCleared", "no retentionPolicyRef: the worker now keeps every version")
	return nil
}
