package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// checkQuota sets QuotaExceeded from the namespace's revault.io/quota and what all its series
// hold (plan.NamespaceUse, over every worker, as of their last sync). A namespace at or over its
// quota gets no new backup from the operator: overQuota suspends the schedule and fails
// backup-now requests. The workers refuse such uploads too, each counting the series it holds,
// objects included. A Namespace that cannot be read leaves the quota Unknown and the series
// going: the workers still enforce what they were told.
func (r *BackupSeriesReconciler) checkQuota(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: s.bs.Namespace}, ns); err != nil {
		s.cs.set(backupv1alpha1.ConditionQuotaExceeded, metav1.ConditionUnknown, "NamespaceUnreadable",
			fmt.Sprintf("cannot read namespace %s for its quota: %v", s.bs.Namespace, err))
		return proceed()
	}
	v, ok := ns.Annotations[backupv1alpha1.QuotaAnnotation]
	if !ok {
		apimeta.RemoveStatusCondition(&st.Conditions, backupv1alpha1.ConditionQuotaExceeded)
		return proceed()
	}
	quota, err := plan.ParseQuota(v)
	if err != nil {
		s.cs.set(backupv1alpha1.ConditionQuotaExceeded, metav1.ConditionUnknown, "InvalidQuota",
			fmt.Sprintf("namespace %s has no quota: %v", s.bs.Namespace, err))
		return proceed()
	}
	var list backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &list, client.InNamespace(s.bs.Namespace)); err != nil {
		return failed(err)
	}
	used := plan.NamespaceUse(list.Items)
	story := fmt.Sprintf("namespace %s holds %s of versions (logical bytes) of its quota %s (%s, %d series)",
		s.bs.Namespace, bytesQ(used), bytesQ(quota), backupv1alpha1.QuotaAnnotation, len(list.Items))
	if used >= quota {
		s.overQuota = true
		s.cs.setTrue(backupv1alpha1.ConditionQuotaExceeded, "OverQuota",
			story+": no new backup starts until versions expire or the quota is raised")
		return proceed()
	}
	s.cs.setFalse(backupv1alpha1.ConditionQuotaExceeded, "WithinQuota", story)
	return proceed()
}

// bytesQ writes a byte count as Kubernetes does ("1536Mi").
func bytesQ(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
