package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/plan"
)

// The Velero data mover. `velero backup create --snapshot-move-data --data-mover revault` makes
// Velero's CSI plugin snapshot each PVC and create a DataUpload with spec.datamover "revault";
// Velero's own node agent leaves those alone. The operator serves them:
//
//   - DataUpload: a PVC restored from the VolumeSnapshot (the snapshot volume) is read by a
//     backup Job into the series named after the source PVC (its BackupSeries is created if the
//     PVC has none); status.progress follows the worker, status.snapshotID is
//     NAMESPACE/SERIES@VERSION, and the snapshot volume is deleted at the end.
//   - DataDownload: a RestoreJob fills a fresh volume like the target PVC's; then, as Velero's own
//     data mover does, that volume is bound to the target PVC that Velero created with a selector
//     matching only a volume the data mover labels.
//
// Both end in Completed, Failed (with the reason in status.message) or Canceled.

// +kubebuilder:rbac:groups=velero.io,resources=datauploads;datadownloads,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;create;delete;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries;restorejobs,verbs=create;delete

// dataMoverPoll is how often a running data movement is looked at.
const dataMoverPoll = 5 * time.Second

// defaultOperationTimeout applies when a DataUpload/DataDownload gives none.
const defaultOperationTimeout = 10 * time.Minute

// DataUploadReconciler moves snapshots into Revault.
type DataUploadReconciler struct {
	client.Client
	// Reader reads PVCs and PVs (which the manager does not cache) from the API server.
	Reader    client.Reader
	Recorder  record.EventRecorder
	Config    *config.Config
	Workers   *Workers
	PodOutput PodOutputReader
	Now       func() time.Time
}

func finished(phase string) bool {
	switch phase {
	case string(velerov2alpha1.DataUploadPhaseCompleted), string(velerov2alpha1.DataUploadPhaseFailed),
		string(velerov2alpha1.DataUploadPhaseCanceled):
		return true
	}
	return false
}

// seriesReady returns the BackupSeries of a PVC, creating it when the PVC has none, and whether it
// is placed with the namespace's token loaded (else why not, for status.message).
func seriesReady(ctx context.Context, c client.Client, ns, name string, media backupv1alpha1.Media, owner string) (
	*backupv1alpha1.BackupSeries, string, error) {
	bs := &backupv1alpha1.BackupSeries{}
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, bs)
	if apierrors.IsNotFound(err) {
		bs = plan.DataMoverSeries(ns, name, media, owner)
		if err := c.Create(ctx, bs); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, "", err
		}
		return nil, fmt.Sprintf("created BackupSeries %s/%s; waiting for its placement", ns, name), nil
	}
	if err != nil {
		return nil, "", err
	}
	if bs.Status.Worker == nil {
		return nil, fmt.Sprintf("waiting for BackupSeries %s/%s to be placed on a worker", ns, name), nil
	}
	for _, t := range []string{backupv1alpha1.ConditionPlaced, backupv1alpha1.ConditionTokenReady} {
		if c := apimeta.FindStatusCondition(bs.Status.Conditions, t); c == nil || c.Status != metav1.ConditionTrue {
			why := "not reported yet"
			if c != nil {
				why = c.Message
			}
			return nil, fmt.Sprintf("waiting for BackupSeries %s/%s (%s: %s)", ns, name, t, why), nil
		}
	}
	return bs, "", nil
}

func opTimeout(d metav1.Duration) time.Duration {
	if d.Duration > 0 {
		return d.Duration
	}
	return defaultOperationTimeout
}

// Reconcile brings one DataUpload forward.
func (r *DataUploadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("dataupload", err) }()
	du := &velerov2alpha1.DataUpload{}
	if err := r.Get(ctx, req.NamespacedName, du); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if du.Spec.DataMover != plan.DataMoverName || finished(string(du.Status.Phase)) {
		return ctrl.Result{}, nil
	}
	orig := du.DeepCopy()
	st := &du.Status
	now := metav1.NewTime(r.Now())
	update := func() error { return writeIfChanged(ctx, r.Client, orig, du) }
	end := func(phase velerov2alpha1.DataUploadPhase, msg string) (ctrl.Result, error) {
		st.Phase, st.Message, st.CompletionTimestamp = phase, msg, &now
		r.cleanup(ctx, du)
		r.Recorder.Event(du, endEventType(phase == velerov2alpha1.DataUploadPhaseCompleted), "DataUpload"+string(phase), msg)
		return ctrl.Result{}, update()
	}

	if du.Spec.Cancel {
		return end(velerov2alpha1.DataUploadPhaseCanceled, "canceled by Velero")
	}
	if st.Phase == "" || st.Phase == velerov2alpha1.DataUploadPhaseNew {
		if why := plan.CheckDataUpload(du); why != "" {
			return end(velerov2alpha1.DataUploadPhaseFailed, why)
		}
		st.Phase, st.AcceptedTimestamp, st.StartTimestamp = velerov2alpha1.DataUploadPhaseAccepted, &now, &now
		st.Message = "accepted by the revault data mover"
		return ctrl.Result{RequeueAfter: time.Second}, update()
	}
	waiting := func(msg string) (ctrl.Result, error) {
		o.waiting = true
		if st.StartTimestamp != nil && now.Sub(st.StartTimestamp.Time) > opTimeout(du.Spec.OperationTimeout) {
			return end(velerov2alpha1.DataUploadPhaseFailed,
				fmt.Sprintf("timed out after %s: %s", opTimeout(du.Spec.OperationTimeout), msg))
		}
		st.Message = msg
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}

	media, _ := plan.MediaFromConfig(du.Spec.DataMoverConfig)
	ns := du.Spec.SourceNamespace
	bs, msg, err := seriesReady(ctx, r.Client, ns, du.Spec.SourcePVC, media, plan.DataMoverRef("DataUpload", du.Namespace, du.Name))
	if err != nil {
		return ctrl.Result{}, err
	}
	if bs == nil {
		return waiting(msg)
	}
	if bs.Spec.Source.PVC == nil || bs.Spec.Source.PVC.ClaimName != du.Spec.SourcePVC {
		return end(velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf(
			"BackupSeries %s/%s exists but does not back up PVC %s: the data mover writes to the series named after the PVC",
			ns, bs.Name, du.Spec.SourcePVC))
	}

	job := &batchv1.Job{}
	jobKey := types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(du.Name)}
	err = r.Get(ctx, jobKey, job)
	if apierrors.IsNotFound(err) {
		source := &corev1.PersistentVolumeClaim{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: du.Spec.SourcePVC}, source); err != nil {
			if apierrors.IsNotFound(err) {
				return end(velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf("source PVC %s/%s does not exist", ns, du.Spec.SourcePVC))
			}
			return ctrl.Result{}, err
		}
		pvc := plan.SnapshotPVC(du, source)
		if err := r.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, err
		}
		job = plan.DataUploadJob(r.Config, bs, bs.Status.Worker.Endpoint, du)
		if err := r.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(du, "Normal", "BackupStarted", "Job %s/%s reads snapshot %s into series %s",
			ns, job.Name, du.Spec.CSISnapshot.VolumeSnapshot, plan.SeriesID(ns, bs.Name))
		st.Phase = velerov2alpha1.DataUploadPhaseInProgress
		st.Progress.TotalBytes = source.Spec.Resources.Requests.Storage().Value()
		st.Message = fmt.Sprintf("backing up snapshot %s into series %s", du.Spec.CSISnapshot.VolumeSnapshot, plan.SeriesID(ns, bs.Name))
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}
	if err != nil {
		return ctrl.Result{}, err
	}

	res := jobFinished(job)
	if !res.done {
		if n, ok := r.Workers.RunningBackupBytes(ctx, bs.Status.Worker, ns, bs.Name); ok {
			st.Progress.BytesDone = n
		}
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}
	out, oerr := jobOutput(ctx, r.Client, r.PodOutput, job)
	if outputPending(oerr, res.at) {
		// The pod's report names the version: wait for it a little.
		logf.FromContext(ctx).Info("reading the backup Job's report", "job", job.Name, "error", oerr.Error())
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if !res.succeeded {
		return end(velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf("backup Job %s/%s failed: %s", ns, job.Name, res.failure(out)))
	}
	rep, err := plan.ParsePushReport(out.Report)
	if err != nil || rep.Version == nil {
		why := "its pod printed no JSON report"
		if oerr != nil {
			why = oerr.Error()
		}
		return end(velerov2alpha1.DataUploadPhaseFailed, fmt.Sprintf(
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
	return end(velerov2alpha1.DataUploadPhaseCompleted, fmt.Sprintf("backed up %d bytes as version %d of series %s",
		rep.LogicalBytes, *rep.Version, plan.SeriesID(ns, bs.Name)))
}

// SetupWithManager watches DataUploads and the backup Jobs made for them.
func (r *DataUploadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("dataupload").
		For(&velerov2alpha1.DataUpload{}).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return dataMoverOwner(o, "DataUpload")
		})).
		Complete(r)
}

// dataMoverOwner maps a Job or RestoreJob back to the DataUpload/DataDownload it serves (its
// annotation is plan.DataMoverRef's "KIND NAMESPACE/NAME").
func dataMoverOwner(o client.Object, kind string) []reconcile.Request {
	k, ref, _ := strings.Cut(o.GetAnnotations()[plan.AnnotationDataMover], " ")
	ns, name, ok := strings.Cut(ref, "/")
	if k != kind || !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

// writeIfChanged writes a DataUpload or DataDownload back when it changed. Velero's CRDs have no
// status subresource: status is written with the object.
func writeIfChanged(ctx context.Context, c client.Client, orig, obj client.Object) error {
	x, err1 := json.Marshal(orig)
	y, err2 := json.Marshal(obj)
	if err1 == nil && err2 == nil && string(x) == string(y) {
		return nil
	}
	return c.Update(ctx, obj)
}

// endEventType is the type of the event a data movement ends with.
func endEventType(completed bool) string {
	if completed {
		return "Normal"
	}
	return "Warning"
}

// DataDownloadReconciler restores Revault versions for Velero.
type DataDownloadReconciler struct {
	client.Client
	Reader   client.Reader
	Recorder record.EventRecorder
	Now      func() time.Time
}

// Reconcile brings one DataDownload forward.
func (r *DataDownloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("datadownload", err) }()
	dd := &velerov2alpha1.DataDownload{}
	if err := r.Get(ctx, req.NamespacedName, dd); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if dd.Spec.DataMover != plan.DataMoverName || finished(string(dd.Status.Phase)) {
		return ctrl.Result{}, nil
	}
	orig := dd.DeepCopy()
	st := &dd.Status
	now := metav1.NewTime(r.Now())
	update := func() error { return writeIfChanged(ctx, r.Client, orig, dd) }
	end := func(phase velerov2alpha1.DataDownloadPhase, msg string) (ctrl.Result, error) {
		st.Phase, st.Message, st.CompletionTimestamp = phase, msg, &now
		completed := phase == velerov2alpha1.DataDownloadPhaseCompleted
		if !completed {
			r.cleanup(ctx, dd)
		}
		r.Recorder.Event(dd, endEventType(completed), "DataDownload"+string(phase), msg)
		return ctrl.Result{}, update()
	}

	if dd.Spec.Cancel {
		return end(velerov2alpha1.DataDownloadPhaseCanceled, "canceled by Velero")
	}
	ns, series, version, perr := plan.ParseSnapshotID(dd.Spec.SnapshotID)
	target := dd.Spec.TargetVolume
	if st.Phase == "" || st.Phase == velerov2alpha1.DataDownloadPhaseNew {
		switch {
		case perr != nil:
			return end(velerov2alpha1.DataDownloadPhaseFailed, perr.Error())
		case target.Namespace == "" || target.PVC == "":
			return end(velerov2alpha1.DataDownloadPhaseFailed, "spec.targetVolume.namespace and .pvc are required")
		case target.Namespace != ns:
			return end(velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf(
				"snapshot %s belongs to namespace %s: restoring it into namespace %s is not supported (series are scoped to their namespace)",
				dd.Spec.SnapshotID, ns, target.Namespace))
		}
		st.Phase, st.AcceptedTimestamp, st.StartTimestamp = velerov2alpha1.DataDownloadPhaseAccepted, &now, &now
		st.Message = "accepted by the revault data mover"
		return ctrl.Result{RequeueAfter: time.Second}, update()
	}
	if perr != nil {
		return end(velerov2alpha1.DataDownloadPhaseFailed, perr.Error())
	}
	waiting := func(msg string) (ctrl.Result, error) {
		o.waiting = true
		if st.Phase != velerov2alpha1.DataDownloadPhaseInProgress && st.StartTimestamp != nil &&
			now.Sub(st.StartTimestamp.Time) > opTimeout(dd.Spec.OperationTimeout) {
			return end(velerov2alpha1.DataDownloadPhaseFailed,
				fmt.Sprintf("timed out after %s: %s", opTimeout(dd.Spec.OperationTimeout), msg))
		}
		st.Message = msg
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}

	tpvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: target.PVC}, tpvc); err != nil {
		if apierrors.IsNotFound(err) {
			return waiting(fmt.Sprintf("waiting for Velero to create the target PVC %s/%s", ns, target.PVC))
		}
		return ctrl.Result{}, err
	}

	// Once the restore volume was handed over, only the binding is left to watch.
	if pvName := dd.Annotations[plan.AnnotationRestorePV]; pvName != "" {
		return r.rebind(ctx, dd, tpvc, pvName, waiting, end)
	}

	bs, msg, err := seriesReady(ctx, r.Client, ns, series, backupv1alpha1.MediaSSD, plan.DataMoverRef("DataDownload", dd.Namespace, dd.Name))
	if err != nil {
		return ctrl.Result{}, err
	}
	if bs == nil {
		return waiting(msg)
	}
	name := plan.DataDownloadObjectName(dd.Name)
	rj := &backupv1alpha1.RestoreJob{}
	err = r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rj)
	if apierrors.IsNotFound(err) {
		if err := r.Create(ctx, plan.RestorePVC(dd, tpvc)); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, err
		}
		rj = plan.DataDownloadRestore(dd, series, version)
		if err := r.Create(ctx, rj); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(dd, "Normal", "RestoreStarted", "RestoreJob %s/%s restores version %d of series %s",
			ns, name, version, plan.SeriesID(ns, series))
		st.Phase = velerov2alpha1.DataDownloadPhaseInProgress
		st.Progress.TotalBytes = dd.Spec.SnapshotSize
		st.Message = fmt.Sprintf("restoring version %d of series %s", version, plan.SeriesID(ns, series))
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	switch rj.Status.Phase {
	case backupv1alpha1.RestoreFailed:
		why := "the RestoreJob failed"
		if c := apimeta.FindStatusCondition(rj.Status.Conditions, backupv1alpha1.ConditionFailed); c != nil && c.Message != "" {
			why = c.Message
		}
		return end(velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf("RestoreJob %s/%s failed: %s", ns, name, why))
	case backupv1alpha1.RestoreSucceeded:
	default:
		if rj.Status.TotalBytes > 0 {
			st.Progress.TotalBytes = rj.Status.TotalBytes
		}
		st.Progress.BytesDone = rj.Status.RestoredBytes
		return ctrl.Result{RequeueAfter: dataMoverPoll}, update()
	}
	st.Progress.TotalBytes, st.Progress.BytesDone = rj.Status.RestoredBytes, rj.Status.RestoredBytes
	// The restore volume holds the data: hand its PV over to the target PVC.
	rpvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rpvc); err != nil {
		if apierrors.IsNotFound(err) {
			return end(velerov2alpha1.DataDownloadPhaseFailed, fmt.Sprintf("the restore volume %s/%s disappeared", ns, name))
		}
		return ctrl.Result{}, err
	}
	if rpvc.Spec.VolumeName == "" {
		return waiting(fmt.Sprintf("waiting for the restore volume %s/%s to be bound", ns, name))
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: rpvc.Spec.VolumeName}, pv); err != nil {
		return ctrl.Result{}, err
	}
	if _, kept := pv.Annotations[plan.AnnotationReclaimPolicy]; !kept {
		if pv.Annotations == nil {
			pv.Annotations = map[string]string{}
		}
		pv.Annotations[plan.AnnotationReclaimPolicy] = string(pv.Spec.PersistentVolumeReclaimPolicy)
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		if err := r.Update(ctx, pv); err != nil {
			return ctrl.Result{}, err
		}
	}
	if dd.Annotations == nil {
		dd.Annotations = map[string]string{}
	}
	dd.Annotations[plan.AnnotationRestorePV] = pv.Name
	if err := update(); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: time.Second}, nil
}

// SetupWithManager watches DataDownloads and the RestoreJobs made for them.
func (r *DataDownloadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("datadownload").
		For(&velerov2alpha1.DataDownload{}).
		Watches(&backupv1alpha1.RestoreJob{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return dataMoverOwner(o, "DataDownload")
		})).
		Complete(r)
}
