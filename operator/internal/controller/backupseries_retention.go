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
// condition. Either way it records whether the series keeps every version.
func (r *BackupSeriesReconciler) checkRetentionPolicy(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	ref := bs.Spec.RetentionPolicyRef
	if ref == nil {
		apimeta.RemoveStatusCondition(&bs.Status.Conditions, backupv1alpha1.ConditionRetentionPolicyFound)
		s.keepsAll = true
		return proceed()
	}
	found, err := r.policyExists(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: ref.Name})
	switch {
	case err != nil:
		return failed(err)
	case !found:
		s.keepsAll = true
		s.cs.setFalse(backupv1alpha1.ConditionRetentionPolicyFound, "NotFound",
			fmt.Sprintf("RetentionPolicy %s not found in namespace %s: every version is kept", ref.Name, bs.Namespace))
	default:
		s.cs.setTrue(backupv1alpha1.ConditionRetentionPolicyFound, "Found", "RetentionPolicy "+ref.Name)
	}
	return proceed()
}

// policyExists reads the policy from the cache, and confirms a miss uncached: a policy created a
// moment ago may not be in the cache yet, and clearing the rules it just pushed would leave the
// worker keeping everything while the policy reports itself applied.
// A policy being deleted (held only by someone else's finalizer) no longer governs anything.
func (r *BackupSeriesReconciler) policyExists(ctx context.Context, key types.NamespacedName) (bool, error) {
	rp := &backupv1alpha1.RetentionPolicy{}
	err := r.Get(ctx, key, rp)
	if apierrors.IsNotFound(err) && r.Reader != nil {
		err = r.Reader.Get(ctx, key, rp)
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil && rp.DeletionTimestamp.IsZero(), err
}

// clearRetention removes retention rules a RetentionPolicy left on the worker when the series no
// longer has one (its reference was removed, or the policy deleted): the series then keeps every
// version, as its RetentionPolicyFound condition says, and the worker must not go on expiring by
// the old rules. s is the series as the worker reported it.
func (r *BackupSeriesReconciler) clearRetention(ctx context.Context, api *instrumented, bs *backupv1alpha1.BackupSeries,
	s *workerclient.SeriesDetail, cs conditionSetter) error {
	sr := s.Retention
	hasRules := sr.Keep != nil || sr.KeepWithinSeconds != nil || sr.KeepHourly != nil || sr.KeepDaily != nil ||
		sr.KeepWeekly != nil || sr.KeepMonthly != nil || sr.KeepYearly != nil
	if !hasRules {
		return nil
	}
	// Asked again right before clearing: this reconcile found no policy a while ago (before
	// the worker answered), and one created since may have just pushed these very rules.
	if ref := bs.Spec.RetentionPolicyRef; ref != nil {
		found, err := r.policyExists(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: ref.Name})
		if err != nil || found {
			return err
		}
	}
	// What a new series gets: every version kept, live window 1, automatic slides.
	live, auto := int64(1), true
	if err := api.PutRetention(ctx, bs.Namespace, bs.Name, workerclient.Retention{Live: &live, Auto: &auto}); err != nil {
		cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", "clearing retention: "+err.Error())
		return err
	}
	why := "no retentionPolicyRef"
	if ref := bs.Spec.RetentionPolicyRef; ref != nil {
		why = "RetentionPolicy " + ref.Name + " not found"
	}
	r.Recorder.Event(bs, "Normal", "RetentionCleared", why+": the worker now keeps every version")
	return nil
}
