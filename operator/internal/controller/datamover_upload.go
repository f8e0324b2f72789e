package controller

import (
	"context"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/revault-io/revault/operator/internal/plan"
)

// cleanup deletes a DataUpload's snapshot volume (and a running Job when it ends early).
func (r *DataUploadReconciler) cleanup(ctx context.Context, du *velerov2alpha1.DataUpload) {
	ns, name := du.Spec.SourceNamespace, plan.DataUploadObjectName(du.Name)
	if ns == "" {
		return
	}
	job := &batchv1.Job{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, job); err == nil && !jobFinished(job).done {
		_ = r.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := r.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("deleting the snapshot volume", "pvc", name, "error", err.Error())
	}
}
