package controller

import (
	"context"
	"fmt"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// rebind hands the restored volume pvName to the target PVC: the restore PVC goes (the volume is
// Retained meanwhile), the target PVC is pointed at the volume and the volume at the target PVC,
// with the labels of the target's selector; once bound, the volume's reclaim policy comes back.
func (r *DataDownloadReconciler) rebind(ctx context.Context, dd *velerov2alpha1.DataDownload, target *corev1.PersistentVolumeClaim,
	pvName string, waiting func(string) (ctrl.Result, error),
	end func(velerov2alpha1.DataDownloadPhase, string) (ctrl.Result, error)) (ctrl.Result, error) {
	ns, name := target.Namespace, plan.DataDownloadObjectName(dd.Name)
	rpvc := &corev1.PersistentVolumeClaim{}
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rpvc)
	switch {
	case err == nil:
		if rpvc.DeletionTimestamp == nil {
			if err := r.Delete(ctx, rpvc); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
		return waiting(fmt.Sprintf("waiting for the restore volume's claim %s/%s to go", ns, name))
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: pvName}, pv); err != nil {
		if apierrors.IsNotFound(err) {
			return end(velerov2alpha1.DataDownloadPhaseFailed, "the restored volume "+pvName+" disappeared")
		}
		return ctrl.Result{}, err
	}
	if target.Spec.VolumeName != pvName {
		patch := client.MergeFrom(target.DeepCopy())
		target.Spec.VolumeName = pvName
		delete(target.Annotations, "pv.kubernetes.io/bind-completed")
		delete(target.Annotations, "pv.kubernetes.io/bound-by-controller")
		if err := r.Patch(ctx, target, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	claimed := pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns && pv.Spec.ClaimRef.Name == target.Name
	if !claimed {
		patch := client.MergeFrom(pv.DeepCopy())
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: target.Name}
		delete(pv.Annotations, "pv.kubernetes.io/bound-by-controller")
		if target.Spec.Selector != nil {
			if pv.Labels == nil {
				pv.Labels = map[string]string{}
			}
			for k, v := range target.Spec.Selector.MatchLabels {
				pv.Labels[k] = v
			}
		}
		if err := r.Patch(ctx, pv, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	if pv.Status.Phase != corev1.VolumeBound {
		return waiting(fmt.Sprintf("waiting for volume %s to bind to PVC %s/%s", pvName, ns, target.Name))
	}
	if policy, ok := pv.Annotations[plan.AnnotationReclaimPolicy]; ok {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(policy)
		delete(pv.Annotations, plan.AnnotationReclaimPolicy)
		if err := r.Update(ctx, pv); err != nil {
			return ctrl.Result{}, err
		}
	}
	_, series, version, _ := plan.ParseSnapshotID(dd.Spec.SnapshotID)
	return end(velerov2alpha1.DataDownloadPhaseCompleted, fmt.Sprintf("restored version %d of series %s into PVC %s/%s",
		version, plan.SeriesID(ns, series), ns, target.Name))
}

// cleanup removes a failed or canceled DataDownload's RestoreJob and restore volume.
func (r *DataDownloadReconciler) cleanup(ctx context.Context, dd *velerov2alpha1.DataDownload) {
	ns, name := dd.Spec.TargetVolume.Namespace, plan.DataDownloadObjectName(dd.Name)
	if ns == "" {
		return
	}
	rj := &backupv1alpha1.RestoreJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := r.Delete(ctx, rj); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("deleting the RestoreJob", "name", name, "error", err.Error())
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := r.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("deleting the restore volume", "pvc", name, "error", err.Error())
	}
}
