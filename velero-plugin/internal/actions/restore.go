package actions

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/label"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
)

// PVCRestore is the RestoreItemAction v2 `revault.io/pvc-restore`. Velero restores PVs, PVCs
// and pods before custom resources, so the data comes back in steps:
//
//   - a PV whose backed-up copy is marked by revault.io/pvc-backup is not restored;
//   - a PVC whose backed-up copy names its series and request is restored without its old volume
//     binding (it gets a new volume), and its restore is an operation ("NAMESPACE/RESTOREJOB");
//   - a pod that mounts such a PVC gets the scheduling gate revault.io/restore;
//   - the PVC's BackupSeries, whose backed-up copy records the version, is restored without its
//     backup-now annotation (a restore starts no backup), and a RestoreJob puts that version into
//     the PVC (the operator adopts the series, which its worker still holds);
//   - Progress follows the RestoreJob and removes the gate from each pod whose volumes are all
//     back, so the workload starts only once its data is there.
type PVCRestore struct {
	Log logrus.FieldLogger
}

// Name is the registered name.
func (a *PVCRestore) Name() string { return "revault.io/pvc-restore" }

// AppliesTo selects PVCs, pods, PVs and BackupSeries.
func (a *PVCRestore) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{
		"persistentvolumeclaims", "pods", "persistentvolumes", "backupseries.backup.revault.io"}}, nil
}

// RestoreJobName is the RestoreJob of a PVC in a Velero restore.
func RestoreJobName(restore, pvc string) string {
	return kube.FitName("velero-"+restore+"-"+pvc, 63)
}

// Execute prepares a PVC, gates a pod, starts the RestoreJob of a BackupSeries, or leaves a PV
// out.
func (a *PVCRestore) Execute(in *velero.RestoreItemActionExecuteInput) (*velero.RestoreItemActionExecuteOutput, error) {
	u := &unstructured.Unstructured{Object: in.Item.UnstructuredContent()}
	from := &unstructured.Unstructured{Object: in.ItemFromBackup.UnstructuredContent()}
	switch u.GetKind() {
	case "PersistentVolumeClaim":
		return a.restorePVC(u, from, in.Restore)
	case "Pod":
		return a.gatePod(u, in.Restore)
	case "BackupSeries":
		return a.restoreSeries(u, from, in.Restore)
	case "PersistentVolume":
		// The claim's data comes back from Revault into a new volume (see PVCBackup.markVolume).
		if claim := from.GetAnnotations()[kube.AnnData]; claim != "" {
			a.Log.WithFields(logrus.Fields{"pv": u.GetName(), "pvc": claim}).
				Info("not restoring the PV: its claim's data is restored from Revault into a new volume")
			return velero.NewRestoreItemActionExecuteOutput(in.Item).WithoutRestore(), nil
		}
	}
	return velero.NewRestoreItemActionExecuteOutput(in.Item), nil
}

// mapped refuses a restore into another namespace: series and their tokens belong to theirs.
func mapped(kind string, u, from *unstructured.Unstructured, series string) error {
	if u.GetNamespace() == from.GetNamespace() {
		return nil
	}
	return fmt.Errorf("%s %s/%s: its data is in Revault series %s/%s; restoring into namespace %s is not supported (series and their tokens are scoped to their namespace)",
		kind, from.GetNamespace(), from.GetName(), from.GetNamespace(), series, u.GetNamespace())
}

func (a *PVCRestore) restorePVC(u, from *unstructured.Unstructured, restore *velerov1.Restore) (*velero.RestoreItemActionExecuteOutput, error) {
	ann := from.GetAnnotations()
	series := ann[kube.AnnSeries]
	if series == "" || ann[kube.AnnRequest] == "" {
		return velero.NewRestoreItemActionExecuteOutput(u), nil
	}
	if err := mapped("PVC", u, from, series); err != nil {
		return nil, err
	}
	// A fresh volume: the old binding points at a volume that is gone or belongs to the past.
	unstructured.RemoveNestedField(u.Object, "spec", "volumeName")
	a2 := u.GetAnnotations()
	for _, k := range []string{"pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller",
		"volume.kubernetes.io/selected-node", velerov1.MustIncludeAdditionalItemAnnotation} {
		delete(a2, k)
	}
	u.SetAnnotations(a2)
	a.Log.WithFields(logrus.Fields{"pvc": u.GetNamespace() + "/" + u.GetName(), "series": series, "restore": restore.Name}).
		Info("the PVC gets a new volume; its BackupSeries' restore puts the data back from Revault")
	return velero.NewRestoreItemActionExecuteOutput(u).WithOperationID(u.GetNamespace() + "/" + RestoreJobName(restore.Name, u.GetName())), nil
}

// restoredByRevault reports whether the live PVC ns/name was restored by this Velero restore as
// a PVC whose data comes from Revault.
func restoredByRevault(pvc *corev1.PersistentVolumeClaim, restore string) bool {
	return pvc.Labels[velerov1.RestoreNameLabel] == label.GetValidName(restore) && pvc.Annotations[kube.AnnSeries] != ""
}

func (a *PVCRestore) restoreSeries(u, from *unstructured.Unstructured, restore *velerov1.Restore) (*velero.RestoreItemActionExecuteOutput, error) {
	// Whatever the series: a restore must not start a backup (the restored object has no
	// status, so the operator would take its backup-now value as new).
	a2 := u.GetAnnotations()
	for _, k := range []string{backupv1alpha1.BackupNowAnnotation, kube.AnnRequest, kube.AnnVersion, kube.AnnPVC, kube.AnnWorker} {
		delete(a2, k)
	}
	u.SetAnnotations(a2)
	out := velero.NewRestoreItemActionExecuteOutput(u)
	claim := from.GetAnnotations()[kube.AnnPVC]
	if claim == "" {
		return out, nil
	}
	version, recorded, err := recordedVersion(from)
	if err != nil {
		return nil, err
	}
	if !recorded {
		return out, nil
	}
	if err := mapped("BackupSeries", u, from, from.GetName()); err != nil {
		return nil, err
	}
	ns, series := u.GetNamespace(), u.GetName()
	log := a.Log.WithFields(logrus.Fields{"series": ns + "/" + series, "pvc": claim, "version": version, "restore": restore.Name})
	c, err := kube.Client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, pvc); err != nil || !restoredByRevault(pvc, restore.Name) {
		// The PVC existed already (Velero leaves existing objects alone) or was not restored.
		log.Info("the PVC was not restored by this restore: its data is left as it is")
		return out, client.IgnoreNotFound(err)
	}
	rj := &backupv1alpha1.RestoreJob{
		ObjectMeta: metav1.ObjectMeta{
			Name: RestoreJobName(restore.Name, claim), Namespace: ns,
			Labels: map[string]string{
				"app.kubernetes.io/managed-by": kube.ManagedBy,
				kube.LabelRestore:              kube.LabelValue(restore.Name),
				kube.LabelPVC:                  kube.LabelValue(claim),
			},
		},
		Spec: backupv1alpha1.RestoreJobSpec{
			SeriesRef: backupv1alpha1.LocalObjectReference{Name: series},
			Version:   strconv.FormatInt(version, 10),
			TargetPVC: backupv1alpha1.PVCTarget{ClaimName: claim},
		},
	}
	if err := c.Create(ctx, rj); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating RestoreJob %s/%s: %w", ns, rj.Name, err)
	}
	log.WithField("restoreJob", rj.Name).Info("restoring the volume from Revault")
	return out, nil
}

// restoresOf returns the RestoreJobs a Velero restore created in ns, by PVC.
func restoresOf(ctx context.Context, c client.Client, ns, restore string) (map[string]*backupv1alpha1.RestoreJob, error) {
	var list backupv1alpha1.RestoreJobList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{kube.LabelRestore: kube.LabelValue(restore)}); err != nil {
		return nil, err
	}
	out := map[string]*backupv1alpha1.RestoreJob{}
	for i := range list.Items {
		out[list.Items[i].Spec.TargetPVC.ClaimName] = &list.Items[i]
	}
	return out, nil
}

// pendingClaims returns the claims of pod that this restore restored from Revault.
func pendingClaims(ctx context.Context, c client.Client, pod *corev1.Pod, restore string) ([]string, error) {
	var out []string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: v.PersistentVolumeClaim.ClaimName}, pvc)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if restoredByRevault(pvc, restore) {
			out = append(out, pvc.Name)
		}
	}
	return out, nil
}

func (a *PVCRestore) gatePod(u *unstructured.Unstructured, restore *velerov1.Restore) (*velero.RestoreItemActionExecuteOutput, error) {
	pod := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pod); err != nil {
		return nil, err
	}
	c, err := kube.Client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	claims, err := pendingClaims(ctx, c, pod, restore.Name)
	if err != nil {
		return nil, err
	}
	if len(claims) == 0 {
		return velero.NewRestoreItemActionExecuteOutput(u), nil
	}
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == kube.SchedulingGate {
			return velero.NewRestoreItemActionExecuteOutput(u), nil
		}
	}
	gates, _, _ := unstructured.NestedSlice(u.Object, "spec", "schedulingGates")
	gates = append(gates, map[string]any{"name": kube.SchedulingGate})
	if err := unstructured.SetNestedSlice(u.Object, gates, "spec", "schedulingGates"); err != nil {
		return nil, err
	}
	a.Log.WithFields(logrus.Fields{"pod": pod.Namespace + "/" + pod.Name, "claims": claims}).
		Info("holding the pod until its volumes are restored from Revault")
	return velero.NewRestoreItemActionExecuteOutput(u), nil
}

// releasePods removes the scheduling gate from the pods of ns whose volumes restored from Revault
// by this restore are all back.
func (a *PVCRestore) releasePods(ctx context.Context, c client.Client, ns, restore string) error {
	rjs, err := restoresOf(ctx, c, ns, restore)
	if err != nil {
		return err
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		gated := -1
		for j, g := range pod.Spec.SchedulingGates {
			if g.Name == kube.SchedulingGate {
				gated = j
			}
		}
		if gated < 0 {
			continue
		}
		claims, err := pendingClaims(ctx, c, pod, restore)
		if err != nil {
			return err
		}
		ready := true
		for _, cl := range claims {
			if rj, ok := rjs[cl]; !ok || rj.Status.Phase != backupv1alpha1.RestoreSucceeded {
				ready = false
			}
		}
		if !ready {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates[:gated], pod.Spec.SchedulingGates[gated+1:]...)
		if err := c.Patch(ctx, pod, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing pod %s/%s: %w", ns, pod.Name, err)
		}
		a.Log.WithField("pod", ns+"/"+pod.Name).Info("volumes restored: the pod may start")
	}
	return nil
}

// Progress reports the PVC's RestoreJob and releases pods whose volumes are back. Velero asks
// only once every item of the restore was restored, so a RestoreJob that does not exist by then
// never will.
func (a *PVCRestore) Progress(operationID string, restore *velerov1.Restore) (velero.OperationProgress, error) {
	p, err := splitID(operationID, 2)
	if err != nil {
		return velero.OperationProgress{}, err
	}
	c, err := kube.Client()
	if err != nil {
		return velero.OperationProgress{}, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	rj := &backupv1alpha1.RestoreJob{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: p[0], Name: p[1]}, rj); err != nil {
		if apierrors.IsNotFound(err) {
			return velero.OperationProgress{Completed: true, Err: fmt.Sprintf(
				"no RestoreJob %s was created, so the PVC's data was not restored from Revault: the restore left the PVC's BackupSeries out (include backupseries.backup.revault.io), or the backup recorded no version for it (its Revault backup failed); pods using the PVC stay held by the scheduling gate %s",
				operationID, kube.SchedulingGate)}, nil
		}
		return velero.OperationProgress{}, fmt.Errorf("operation %s: %w", operationID, err)
	}
	st := rj.Status
	out := velero.OperationProgress{OperationUnits: "Bytes", NTotal: st.TotalBytes, NCompleted: st.RestoredBytes}
	if st.StartTime != nil {
		out.Started = st.StartTime.Time
	}
	if st.CompletionTime != nil {
		out.Updated = st.CompletionTime.Time
	}
	switch st.Phase {
	case backupv1alpha1.RestoreSucceeded:
		out.Completed = true
		out.Description = fmt.Sprintf("restored version %d of series %s/%s", st.ResolvedVersion, rj.Namespace, rj.Spec.SeriesRef.Name)
		if err := a.releasePods(ctx, c, rj.Namespace, restore.Name); err != nil {
			return out, err
		}
	case backupv1alpha1.RestoreFailed:
		out.Completed = true
		why := "the RestoreJob failed"
		for _, cond := range st.Conditions {
			if cond.Type == backupv1alpha1.ConditionFailed && cond.Message != "" {
				why = cond.Message
			}
		}
		out.Err = fmt.Sprintf("restoring PVC %s/%s from Revault failed: %s (pods using it stay held by the scheduling gate %s)",
			rj.Namespace, rj.Spec.TargetPVC.ClaimName, why, kube.SchedulingGate)
	default:
		out.Description = fmt.Sprintf("RestoreJob %s/%s is %s", rj.Namespace, rj.Name, orPending(string(st.Phase)))
	}
	return out, nil
}

func orPending(s string) string {
	if s == "" {
		return "Pending"
	}
	return s
}

// Cancel deletes the RestoreJob.
func (a *PVCRestore) Cancel(operationID string, restore *velerov1.Restore) error {
	p, err := splitID(operationID, 2)
	if err != nil {
		return err
	}
	c, err := kube.Client()
	if err != nil {
		return err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	rj := &backupv1alpha1.RestoreJob{ObjectMeta: metav1.ObjectMeta{Namespace: p[0], Name: p[1]}}
	return client.IgnoreNotFound(c.Delete(ctx, rj))
}

// AreAdditionalItemsReady: the action returns no additional items.
func (a *PVCRestore) AreAdditionalItemsReady(_ []velero.ResourceIdentifier, _ *velerov1.Restore) (bool, error) {
	return true, nil
}

// SkipOperatorObjects is the RestoreItemAction v2 `revault.io/skip-operator-objects`: objects
// the operator creates for its own work (backup and restore Jobs, their pods and CronJobs, the
// namespace's token Secret) and RestoreJobs (one-shot requests) are not restored; restoring a
// finished restore Job or RestoreJob would run an old restore again over the restored volume.
type SkipOperatorObjects struct {
	Log logrus.FieldLogger
}

// Name is the registered name.
func (a *SkipOperatorObjects) Name() string { return "revault.io/skip-operator-objects" }

// AppliesTo selects the kinds the operator creates.
func (a *SkipOperatorObjects) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{
		"jobs.batch", "cronjobs.batch", "pods", "secrets", "restorejobs.backup.revault.io"}}, nil
}

// Execute skips the operator's objects.
func (a *SkipOperatorObjects) Execute(in *velero.RestoreItemActionExecuteInput) (*velero.RestoreItemActionExecuteOutput, error) {
	u := &unstructured.Unstructured{Object: in.Item.UnstructuredContent()}
	labels := u.GetLabels()
	skip := false
	switch u.GetKind() {
	case "RestoreJob":
		skip = true
	case "Secret":
		skip = u.GetName() == kube.TokenSecret && labels["app.kubernetes.io/part-of"] == "revault"
	default:
		skip = labels["app.kubernetes.io/part-of"] == "revault"
	}
	out := velero.NewRestoreItemActionExecuteOutput(in.Item)
	if skip {
		a.Log.WithField("item", u.GetKind()+" "+u.GetNamespace()+"/"+u.GetName()).Info("not restoring an object of the Revault operator")
		return out.WithoutRestore(), nil
	}
	return out, nil
}

// Progress: the action starts no operations.
func (a *SkipOperatorObjects) Progress(string, *velerov1.Restore) (velero.OperationProgress, error) {
	return velero.OperationProgress{}, fmt.Errorf("revault.io/skip-operator-objects starts no operations")
}

// Cancel: nothing to cancel.
func (a *SkipOperatorObjects) Cancel(string, *velerov1.Restore) error { return nil }

// AreAdditionalItemsReady: none are returned.
func (a *SkipOperatorObjects) AreAdditionalItemsReady([]velero.ResourceIdentifier, *velerov1.Restore) (bool, error) {
	return true, nil
}
