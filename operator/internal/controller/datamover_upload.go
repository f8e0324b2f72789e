package controller

import (
	"context"
	"fmt"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	batchv1 "k8s.io/api/batch/v1"
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

// uploadRun is one reconcile of a DataUpload: the object and a copy as read (Velero's CRDs have no
// status subresource, so the object is written back whole when it changed), the time of this
// reconcile, and the series and Job the steps found.
type uploadRun struct {
	key  types.NamespacedName
	o    *outcome
	du   *velerov2alpha1.DataUpload
	orig *velerov2alpha1.DataUpload
	now  metav1.Time
	// bs is the series the snapshot goes into (findSeries), job the backup Job (startBackup)
	// and res how far that Job got (followBackup).
	bs  *backupv1alpha1.BackupSeries
	job *batchv1.Job
	res jobResult
}

// load reads the DataUpload. One for another data mover, or one that ended, is left alone.
func (r *DataUploadReconciler) load(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	du := &velerov2alpha1.DataUpload{}
	if err := r.Get(ctx, u.key, du); err != nil {
		return stop(ctrl.Result{}, client.IgnoreNotFound(err))
	}
	if du.Spec.DataMover != plan.DataMoverName || finished(string(du.Status.Phase)) {
		return stop(ctrl.Result{}, nil)
	}
	u.du, u.orig, u.now = du, du.DeepCopy(), metav1.NewTime(r.Now())
	return proceed()
}

// accept ends a canceled DataUpload, and checks and accepts a new one (the next reconcile starts
// the work).
func (r *DataUploadReconciler) accept(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	du, st := u.du, &u.du.Status
	if du.Spec.Cancel {
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseCanceled, "canceled by Velero")
	}
	if st.Phase != "" && st.Phase != velerov2alpha1.DataUploadPhaseNew {
		return proceed()
	}
	if why := plan.CheckDataUpload(du); why != "" {
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, why)
	}
	st.Phase, st.AcceptedTimestamp, st.StartTimestamp = velerov2alpha1.DataUploadPhaseAccepted, &u.now, &u.now
	st.Message = "accepted by the revault data mover"
	return stop(ctrl.Result{RequeueAfter: time.Second}, r.update(ctx, u))
}

// findSeries finds the BackupSeries named after the source PVC (creating it when the PVC has
// none) and waits until it is placed with the namespace's token loaded. A series of that name
// that backs up something else is an error: the data mover has nowhere else to write.
func (r *DataUploadReconciler) findSeries(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	du := u.du
	media, _ := plan.MediaFromConfig(du.Spec.DataMoverConfig)
	ns := du.Spec.SourceNamespace
	bs, msg, err := seriesReady(ctx, r.Client, ns, du.Spec.SourcePVC, media, plan.DataMoverRef("DataUpload", du.Namespace, du.Name))
	if err != nil {
		return failed(err)
	}
	if bs == nil {
		return r.waiting(ctx, u, msg)
	}
	if bs.Spec.Source.PVC == nil || bs.Spec.Source.PVC.ClaimName != du.Spec.SourcePVC {
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf(
			"BackupSeries %s/%s exists but does not back up PVC %s: the data mover writes to the series named after the PVC",
			ns, bs.Name, du.Spec.SourcePVC))
	}
	if why := backupsHeld(bs); why != "" {
		// A backup into the old worker now would not be copied: wait for the move to end.
		return r.waiting(ctx, u, fmt.Sprintf("series %s/%s takes no backup while %s; the upload starts after", ns, bs.Name, why))
	}
	u.bs = bs
	return proceed()
}

// startBackup finds the backup Job, or (the first time) makes the snapshot volume from the
// VolumeSnapshot and the Job that reads it into the series.
func (r *DataUploadReconciler) startBackup(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	du, st, bs := u.du, &u.du.Status, u.bs
	ns := du.Spec.SourceNamespace
	job := &batchv1.Job{}
	err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(du.Name)}, job)
	if err == nil {
		u.job = job
		return proceed()
	}
	if !apierrors.IsNotFound(err) {
		return failed(err)
	}
	source := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: du.Spec.SourcePVC}, source); err != nil {
		if apierrors.IsNotFound(err) {
			return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf("source PVC %s/%s does not exist", ns, du.Spec.SourcePVC))
		}
		return failed(err)
	}
	pvc := plan.SnapshotPVC(du, source)
	if err := r.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		return failed(err)
	}
	job = plan.DataUploadJob(r.Config, bs, bs.Status.Worker.Endpoint, du)
	if err := r.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
		return failed(err)
	}
	r.Recorder.Eventf(du, "Normal", "BackupStarted", "Job %s/%s reads snapshot %s into series %s",
		ns, job.Name, du.Spec.CSISnapshot.VolumeSnapshot, plan.SeriesID(ns, bs.Name))
	st.Phase = velerov2alpha1.DataUploadPhaseInProgress
	st.Progress.TotalBytes = source.Spec.Resources.Requests.Storage().Value()
	st.Message = fmt.Sprintf("backing up snapshot %s into series %s", du.Spec.CSISnapshot.VolumeSnapshot, plan.SeriesID(ns, bs.Name))
	return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, u))
}

// followBackup reports the bytes the worker has read so far while the Job runs.
func (r *DataUploadReconciler) followBackup(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	u.res = jobFinished(u.job)
	if u.res.done {
		return proceed()
	}
	if n, ok := readBytes(r.Workers.BackupProgress(ctx, u.bs.Status.Worker, u.du.Spec.SourceNamespace, u.bs.Name)); ok {
		u.du.Status.Progress.BytesDone = n
	}
	return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, u))
}

// complete ends the DataUpload once its Job ended: with the version from the pod's report
// (snapshotID and dataMoverResult say where it is, for the DataDownload of a restore), or failed.
func (r *DataUploadReconciler) complete(ctx context.Context, u *uploadRun) (ctrl.Result, bool, error) {
	du, st, bs, job, res := u.du, &u.du.Status, u.bs, u.job, u.res
	ns := du.Spec.SourceNamespace
	out, oerr := jobOutput(ctx, r.Client, r.PodOutput, job)
	if outputPending(oerr, res.at) {
		// The pod's report names the version: wait for it a little.
		logf.FromContext(ctx).Info("reading the backup Job's report", "job", job.Name, "error", oerr.Error())
		return stop(ctrl.Result{RequeueAfter: time.Second}, nil)
	}
	if !res.succeeded {
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf("backup Job %s/%s failed: %s", ns, job.Name, res.failure(out)))
	}
	rep, err := plan.ParsePushReport(out.Report)
	if err != nil || rep.Version == nil {
		why := "its pod printed no JSON report"
		if oerr != nil {
			why = oerr.Error()
		}
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf(
			"backup Job %s/%s succeeded but its report could not be read (%s), so the version is unknown", ns, job.Name, why))
	}
	st.SnapshotID = plan.SnapshotID(ns, bs.Name, *rep.Version)
	st.Progress.TotalBytes, st.Progress.BytesDone = rep.LogicalBytes, rep.LogicalBytes
	st.IncrementalBytes = rep.NewBytes
	result := map[string]string{
		"series": plan.SeriesID(ns, bs.Name), "version": fmt.Sprint(*rep.Version),
		"worker": bs.Status.Worker.Endpoint,
	}
	st.DataMoverResult = &result
	return r.end(ctx, u, velerov2alpha1.DataUploadPhaseCompleted, fmt.Sprintf("backed up %d bytes as version %d of series %s",
		rep.LogicalBytes, *rep.Version, plan.SeriesID(ns, bs.Name)))
}

// update writes the DataUpload back when a step changed it.
func (r *DataUploadReconciler) update(ctx context.Context, u *uploadRun) error {
	return writeIfChanged(ctx, r.Client, u.orig, u.du)
}

// end ends the DataUpload in phase, with msg for Velero and an event. The snapshot volume goes
// (and the Job, if it still runs).
func (r *DataUploadReconciler) end(ctx context.Context, u *uploadRun, phase velerov2alpha1.DataUploadPhase, msg string) (
	ctrl.Result, bool, error) {
	st := &u.du.Status
	st.Phase, st.Message, st.CompletionTimestamp = phase, msg, &u.now
	r.cleanup(ctx, u.du)
	r.Recorder.Event(u.du, endEventType(phase == velerov2alpha1.DataUploadPhaseCompleted), "DataUpload"+string(phase), msg)
	return stop(ctrl.Result{}, r.update(ctx, u))
}

// waiting records what the DataUpload waits for and looks again shortly; past the operation
// timeout, counted from its start, it fails.
func (r *DataUploadReconciler) waiting(ctx context.Context, u *uploadRun, msg string) (ctrl.Result, bool, error) {
	u.o.waiting = true
	st, limit := &u.du.Status, opTimeout(u.du.Spec.OperationTimeout)
	if st.StartTimestamp != nil && u.now.Sub(st.StartTimestamp.Time) > limit {
		return r.end(ctx, u, velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf("timed out after %s: %s", limit, msg))
	}
	st.Message = msg
	return stop(ctrl.Result{RequeueAfter: dataMoverPoll}, r.update(ctx, u))
}

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
	if err := r.deleteSnapshot(ctx, du); err != nil {
		logf.FromContext(ctx).Info("deleting the VolumeSnapshot", "error", err.Error())
	}
}

// deleteSnapshot deletes the VolumeSnapshot Velero took for the DataUpload, with the snapshot in
// the storage system: the data mover took the data over, and nothing else ever deletes it (as
// Velero's own data mover does, a content whose policy is Retain is switched to Delete first).
// The snapshot controller keeps the snapshot until a volume being made from it is made.
func (r *DataUploadReconciler) deleteSnapshot(ctx context.Context, du *velerov2alpha1.DataUpload) error {
	// Only a snapshot this data mover took over (an accepted DataUpload), and only the one Velero
	// took for the same backup: a DataUpload anyone wrote cannot name any snapshot to destroy.
	backup := du.Labels[velerov1.BackupNameLabel]
	if du.Spec.CSISnapshot == nil || du.Spec.CSISnapshot.VolumeSnapshot == "" || du.Status.AcceptedTimestamp == nil || backup == "" {
		return nil
	}
	vs := &snapshotv1.VolumeSnapshot{}
	key := types.NamespacedName{Namespace: du.Spec.SourceNamespace, Name: du.Spec.CSISnapshot.VolumeSnapshot}
	if err := r.Reader.Get(ctx, key, vs); err != nil {
		return client.IgnoreNotFound(err)
	}
	if vs.Labels[velerov1.BackupNameLabel] != backup {
		return fmt.Errorf("VolumeSnapshot %s is not from Velero backup %s (label %s=%q): left alone",
			key, backup, velerov1.BackupNameLabel, vs.Labels[velerov1.BackupNameLabel])
	}
	if vs.Status != nil && vs.Status.BoundVolumeSnapshotContentName != nil {
		vsc := &snapshotv1.VolumeSnapshotContent{}
		err := r.Reader.Get(ctx, types.NamespacedName{Name: *vs.Status.BoundVolumeSnapshotContentName}, vsc)
		if err == nil && vsc.Spec.DeletionPolicy != snapshotv1.VolumeSnapshotContentDelete {
			patch := client.MergeFrom(vsc.DeepCopy())
			vsc.Spec.DeletionPolicy = snapshotv1.VolumeSnapshotContentDelete
			err = r.Patch(ctx, vsc, patch)
		}
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("VolumeSnapshotContent %s: %w", *vs.Status.BoundVolumeSnapshotContentName, err)
		}
	}
	if err := r.Delete(ctx, vs); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("VolumeSnapshot %s: %w", key, err)
	}
	r.Recorder.Eventf(du, "Normal", "SnapshotDeleted", "deleted VolumeSnapshot %s (its data is in Revault)", key)
	return nil
}
