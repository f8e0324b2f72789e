package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// downloadRun is one reconcile of a DataDownload: the object and a copy as read (written back
// whole when it changed), the time of this reconcile, the snapshot it restores, and what the
// steps found.
type downloadRun struct {
	key  types.NamespacedName
	o    *outcome
	dd   *velerov2alpha1.DataDownload
	orig *velerov2alpha1.DataDownload
	now  metav1.Time
	// ns, series and version are those of spec.snapshotID (NAMESPACE/SERIES@VERSION), and media
	// the pool holding the series (findSeries).
	ns, series string
	version    int64
	media      backupv1alpha1.Media
	// name is the name of the RestoreJob and of the restore volume made for the DataDownload.
	name string
	// target is the PVC Velero made for the volume (findTarget), rj the RestoreJob (startRestore).
	target *corev1.PersistentVolumeClaim
	rj     *backupv1alpha1.RestoreJob
}

// load reads the DataDownload. One for another data mover, or one that ended, is left alone.
func (r *DataDownloadReconciler) load(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	dd := &velerov2alpha1.DataDownload{}
	if err := r.Get(ctx, d.key, dd); err != nil {
		return stop(ctrl.Result{}, client.IgnoreNotFound(err))
	}
	if dd.Spec.DataMover != plan.DataMoverName || finished(string(dd.Status.Phase)) {
		return stop(ctrl.Result{}, nil)
	}
	d.dd, d.orig, d.now = dd, dd.DeepCopy(), metav1.NewTime(r.Now())
	d.name = plan.DataDownloadObjectName(dd.Name)
	return proceed()
}

// accept ends a canceled DataDownload, and checks and accepts a new one (the next reconcile starts
// the work). Its snapshot must be one of this data mover's. Restoring into another namespace than
// the series' (Velero's namespace mapping) needs the series' namespace: the restore runs there,
// with that namespace's token, and only the restored volume moves to the target namespace.
func (r *DataDownloadReconciler) accept(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	dd, st := d.dd, &d.dd.Status
	if dd.Spec.Cancel {
		return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseCanceled, "canceled by Velero")
	}
	var perr error
	d.ns, d.series, d.version, perr = plan.ParseSnapshotID(dd.Spec.SnapshotID)
	target := dd.Spec.TargetVolume
	if st.Phase == "" || st.Phase == velerov2alpha1.DataDownloadPhaseNew {
		switch {
		case perr != nil:
			return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, perr.Error())
		case target.Namespace == "" || target.PVC == "":
			return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, "spec.targetVolume.namespace and .pvc are required")
		}
		if target.Namespace != d.ns {
			if why := r.mappedByRestore(ctx, dd, d.ns, target.Namespace); why != "" {
				return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, why)
			}
			err := r.Reader.Get(ctx, types.NamespacedName{Name: d.ns}, &corev1.Namespace{})
			if apierrors.IsNotFound(err) {
				return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf(
					"snapshot %s belongs to series %s, whose namespace no longer exists: a restore into namespace %s runs in the series' namespace (with its token); create namespace %s, or restore without namespace mapping",
					dd.Spec.SnapshotID, plan.SeriesID(d.ns, d.series), target.Namespace, d.ns))
			}
			if err != nil {
				return failed(err)
			}
		}
		st.Phase, st.AcceptedTimestamp, st.StartTimestamp = velerov2alpha1.DataDownloadPhaseAccepted, &d.now, &d.now
		st.Message = "accepted by the revault data mover"
		return stop(ctrl.Result{RequeueAfter: time.Second}, r.update(ctx, d))
	}
	if perr != nil {
		return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, perr.Error())
	}
	return proceed()
}

// mappedByRestore says why a DataDownload may not restore namespace from's series into namespace
// to ("" when it may): only the Velero Restore that owns it, in its own namespace, can ask for
// that, with a namespace mapping from -> to. Anyone else who can write a DataDownload would
// otherwise read any namespace's data into their own.
func (r *DataDownloadReconciler) mappedByRestore(ctx context.Context, dd *velerov2alpha1.DataDownload, from, to string) string {
	refused := fmt.Sprintf("restoring series of namespace %s into namespace %s needs a Velero Restore owning this DataDownload that maps %s to %s", from, to, from, to)
	for _, o := range dd.OwnerReferences {
		if o.Kind != "Restore" || o.APIVersion != velerov1.SchemeGroupVersion.String() {
			continue
		}
		rs := &velerov1.Restore{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: dd.Namespace, Name: o.Name}, rs); err != nil || rs.UID != o.UID {
			return refused + fmt.Sprintf(" (Restore %s/%s not found)", dd.Namespace, o.Name)
		}
		if rs.Spec.NamespaceMapping[from] == to {
			return ""
		}
	}
	return refused
}

// findTarget waits for the target PVC, which Velero creates with a selector that only the volume
// this data mover labels matches.
func (r *DataDownloadReconciler) findTarget(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	target := d.dd.Spec.TargetVolume
	tpvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: target.Namespace, Name: target.PVC}, tpvc); err != nil {
		if apierrors.IsNotFound(err) {
			return r.waiting(ctx, d, fmt.Sprintf("waiting for Velero to create the target PVC %s/%s", target.Namespace, target.PVC))
		}
		return failed(err)
	}
	d.target = tpvc
	return proceed()
}

// findSeries finds the BackupSeries of the snapshot and waits until it is placed with the
// namespace's token loaded. When the BackupSeries is gone (its namespace was deleted, the usual
// reason for a restore) it is made again on the pool whose worker holds the series' data: a
// series made anywhere else would be new and empty. A series no worker holds fails the restore.
func (r *DataDownloadReconciler) findSeries(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	dd := d.dd
	if res, done, err := r.seriesMedia(ctx, d); done {
		return res, done, err
	}
	bs, msg, err := seriesReady(ctx, r.Client, d.ns, d.series, d.media, plan.DataMoverRef("DataDownload", dd.Namespace, dd.Name))
	if err != nil {
		return failed(err)
	}
	if bs == nil {
		return r.waiting(ctx, d, msg)
	}
	return proceed()
}

// seriesMedia finds the media of the snapshot's series: its BackupSeries', or else that of the
// pool whose worker holds it. It waits while a worker that may hold it does not answer.
func (r *DataDownloadReconciler) seriesMedia(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	bs := &backupv1alpha1.BackupSeries{}
	err := r.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: d.series}, bs)
	if err == nil {
		d.media = bs.Spec.Storage.Media
		return proceed()
	}
	if !apierrors.IsNotFound(err) {
		return failed(err)
	}
	holders, unreachable, err := r.Workers.Holders(ctx, d.ns, d.series, d.version)
	switch {
	case err != nil:
		return failed(err)
	case len(holders) > 1:
		var where []string
		for _, h := range holders {
			where = append(where, fmt.Sprintf("%s worker on %s", h.Media, h.Node))
		}
		return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf(
			"version %d of series %s is held by %d workers (%s): which one Velero backed up is unknown; recreate the BackupSeries with the right storage.media",
			d.version, plan.SeriesID(d.ns, d.series), len(holders), strings.Join(where, ", ")))
	case len(holders) == 1:
		d.media = holders[0].Media
		return proceed()
	case len(unreachable) > 0:
		return r.waiting(ctx, d, fmt.Sprintf("looking for the worker holding series %s: %s",
			plan.SeriesID(d.ns, d.series), joinMax(unreachable, 3)))
	}
	return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf(
		"no Revault worker holds version %d of series %s (snapshot %s): its data was deleted or its store lost",
		d.version,
		plan.SeriesID(d.ns, d.series), d.dd.Spec.SnapshotID))
}

// startRestore finds the RestoreJob, or (the first time) makes a restore volume like the target
// PVC and the RestoreJob that fills it.
func (r *DataDownloadReconciler) startRestore(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	dd, st, ns, name := d.dd, &d.dd.Status, d.ns, d.name
	rj := &backupv1alpha1.RestoreJob{}
	err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rj)
	if err == nil {
		d.rj = rj
		return proceed()
	}
	if !apierrors.IsNotFound(err) {
		return failed(err)
	}
	if err := r.Create(ctx, plan.RestorePVC(dd, ns, d.target)); err != nil && !apierrors.IsAlreadyExists(err) {
		return failed(err)
	}
	rj = plan.DataDownloadRestore(dd, ns, d.series, d.version)
	if err := r.Create(ctx, rj); err != nil && !apierrors.IsAlreadyExists(err) {
		return failed(err)
	}
	r.Recorder.Eventf(dd, "Normal", "RestoreStarted", "RestoreJob %s/%s restores version %d of series %s",
		ns, name, d.version, plan.SeriesID(ns, d.series))
	st.Phase = velerov2alpha1.DataDownloadPhaseInProgress
	st.Progress.TotalBytes = dd.Spec.SnapshotSize
	st.Message = fmt.Sprintf("restoring version %d of series %s", d.version, plan.SeriesID(ns, d.series))
	return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, d))
}

// followRestore reports the RestoreJob's progress until it ends; a failed one fails the
// DataDownload with its reason.
func (r *DataDownloadReconciler) followRestore(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	st, rj := &d.dd.Status, d.rj
	switch rj.Status.Phase {
	case backupv1alpha1.RestoreFailed:
		why := "the RestoreJob failed"
		if c := apimeta.FindStatusCondition(rj.Status.Conditions, backupv1alpha1.ConditionFailed); c != nil && c.Message != "" {
			why = c.Message
		}
		return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf("RestoreJob %s/%s failed: %s", d.ns, d.name, why))
	case backupv1alpha1.RestoreSucceeded:
		st.Progress.TotalBytes, st.Progress.BytesDone = rj.Status.RestoredBytes, rj.Status.RestoredBytes
		return proceed()
	default:
		if rj.Status.TotalBytes > 0 {
			st.Progress.TotalBytes = rj.Status.TotalBytes
		}
		st.Progress.BytesDone = rj.Status.RestoredBytes
		return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, d))
	}
}

// handOver starts handing the restore volume, which now holds the data, over to the target PVC:
// its PV is kept (Retain, the policy it had noted in an annotation) and named in the
// DataDownload's annotation, after which rebind takes over.
func (r *DataDownloadReconciler) handOver(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	dd, ns, name := d.dd, d.ns, d.name
	rpvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rpvc); err != nil {
		if apierrors.IsNotFound(err) {
			return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf("the restore volume %s/%s disappeared", ns, name))
		}
		return failed(err)
	}
	if rpvc.Spec.VolumeName == "" {
		return r.waiting(ctx, d, fmt.Sprintf("waiting for the restore volume %s/%s to be bound", ns, name))
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: rpvc.Spec.VolumeName}, pv); err != nil {
		return failed(err)
	}
	if _, kept := pv.Annotations[plan.AnnotationReclaimPolicy]; !kept {
		if pv.Annotations == nil {
			pv.Annotations = map[string]string{}
		}
		pv.Annotations[plan.AnnotationReclaimPolicy] = string(pv.Spec.PersistentVolumeReclaimPolicy)
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		if err := r.Update(ctx, pv); err != nil {
			return failed(err)
		}
	}
	if dd.Annotations == nil {
		dd.Annotations = map[string]string{}
	}
	dd.Annotations[plan.AnnotationRestorePV] = pv.Name
	if err := r.update(ctx, d); err != nil {
		return failed(err)
	}
	return stop(ctrl.Result{RequeueAfter: time.Second}, nil)
}

// rebind hands the restored volume (named in the DataDownload's annotation once handOver ran) to
// the target PVC: the restore PVC goes (the volume is Retained meanwhile), the target PVC is
// pointed at the volume and the volume at the target PVC, with the labels of the target's
// selector; once bound, the volume's reclaim policy comes back.
func (r *DataDownloadReconciler) rebind(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	pvName := d.dd.Annotations[plan.AnnotationRestorePV]
	if pvName == "" {
		return proceed()
	}
	if res, done, err := r.releaseRestoreClaim(ctx, d); done {
		return res, done, err
	}
	target := d.target
	pv := &corev1.PersistentVolume{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: pvName}, pv); err != nil {
		if apierrors.IsNotFound(err) {
			return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, "the restored volume "+pvName+" disappeared")
		}
		return failed(err)
	}
	if err := r.bind(ctx, target, pv); err != nil {
		return failed(err)
	}
	if pv.Status.Phase != corev1.VolumeBound {
		return r.waiting(ctx, d, fmt.Sprintf("waiting for volume %s to bind to PVC %s/%s", pvName, target.Namespace, target.Name))
	}
	if policy, ok := pv.Annotations[plan.AnnotationReclaimPolicy]; ok {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(policy)
		delete(pv.Annotations, plan.AnnotationReclaimPolicy)
		if err := r.Update(ctx, pv); err != nil {
			return failed(err)
		}
	}
	return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseCompleted, fmt.Sprintf("restored version %d of series %s into PVC %s/%s",
		d.version, plan.SeriesID(d.ns, d.series), target.Namespace, target.Name))
}

// releaseRestoreClaim deletes the restore PVC and waits until it is gone, which frees its volume
// for the target PVC.
func (r *DataDownloadReconciler) releaseRestoreClaim(ctx context.Context, d *downloadRun) (ctrl.Result, bool, error) {
	ns, name := d.ns, d.name
	rpvc := &corev1.PersistentVolumeClaim{}
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rpvc)
	switch {
	case err == nil:
		if rpvc.DeletionTimestamp == nil {
			if err := r.Delete(ctx, rpvc); client.IgnoreNotFound(err) != nil {
				return failed(err)
			}
		}
		return r.waiting(ctx, d, fmt.Sprintf("waiting for the restore volume's claim %s/%s to go", ns, name))
	case !apierrors.IsNotFound(err):
		return failed(err)
	}
	return proceed()
}

// bind points the target PVC at the volume and the volume at the target PVC, giving the volume the
// labels the target's selector asks for; what is already so is left alone.
func (r *DataDownloadReconciler) bind(ctx context.Context, target *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) error {
	if target.Spec.VolumeName != pv.Name {
		patch := client.MergeFrom(target.DeepCopy())
		target.Spec.VolumeName = pv.Name
		delete(target.Annotations, "pv.kubernetes.io/bind-completed")
		delete(target.Annotations, "pv.kubernetes.io/bound-by-controller")
		if err := r.Patch(ctx, target, patch); err != nil {
			return err
		}
	}
	ns := target.Namespace
	claimed := pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns && pv.Spec.ClaimRef.Name == target.Name
	if claimed {
		return nil
	}
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
	return r.Patch(ctx, pv, patch)
}

// update writes the DataDownload back when a step changed it.
func (r *DataDownloadReconciler) update(ctx context.Context, d *downloadRun) error {
	return writeIfChanged(ctx, r.Client, d.orig, d.dd)
}

// end ends the DataDownload in phase, with msg for Velero and an event. Unless it completed, its
// RestoreJob and restore volume go.
func (r *DataDownloadReconciler) end(ctx context.Context, d *downloadRun, phase velerov2alpha1.DataDownloadPhase, msg string) (
	ctrl.Result, bool, error) {
	st := &d.dd.Status
	st.Phase, st.Message, st.CompletionTimestamp = phase, msg, &d.now
	completed := phase == velerov2alpha1.DataDownloadPhaseCompleted
	if !completed {
		r.cleanup(ctx, d.dd)
	}
	r.Recorder.Event(d.dd, endEventType(completed), "DataDownload"+string(phase), msg)
	return stop(ctrl.Result{}, r.update(ctx, d))
}

// waiting records what the DataDownload waits for and looks again shortly. Until its RestoreJob
// started, it fails past the operation timeout, counted from its start; a restore under way is
// not cut short.
func (r *DataDownloadReconciler) waiting(ctx context.Context, d *downloadRun, msg string) (ctrl.Result, bool, error) {
	d.o.waiting = true
	st, limit := &d.dd.Status, opTimeout(d.dd.Spec.OperationTimeout)
	if st.Phase != velerov2alpha1.DataDownloadPhaseInProgress && st.StartTimestamp != nil && d.now.Sub(st.StartTimestamp.Time) > limit {
		return r.end(ctx, d, velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf("timed out after %s: %s", limit, msg))
	}
	st.Message = msg
	return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, d))
}

// cleanup removes a failed or canceled DataDownload's RestoreJob and restore volume, which are
// in the namespace of the snapshot's series.
func (r *DataDownloadReconciler) cleanup(ctx context.Context, dd *velerov2alpha1.DataDownload) {
	ns, _, _, err := plan.ParseSnapshotID(dd.Spec.SnapshotID)
	if err != nil {
		return
	}
	name := plan.DataDownloadObjectName(dd.Name)
	rj := &backupv1alpha1.RestoreJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := r.Delete(ctx, rj); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("deleting the RestoreJob", "name", name, "error", err.Error())
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := r.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		logf.FromContext(ctx).Info("deleting the restore volume", "pvc", name, "error", err.Error())
	}
}
