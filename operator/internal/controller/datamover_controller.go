package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
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

// Its RBAC markers are in internal/rbac/datamover, generated into a role of their own that the
// chart grants only with velero.dataMover.

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

// Reconcile brings one DataUpload forward, in these steps.
func (r *DataUploadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("dataupload", err) }()
	return runSteps(ctx, &uploadRun{key: req.NamespacedName, o: &o},
		r.load,         // read it; one for another data mover, or one that ended, is left alone
		r.accept,       // a canceled one ends; a new one is checked and accepted
		r.findSeries,   // the series named after the source PVC, placed, its token loaded
		r.startBackup,  // the snapshot volume and the backup Job, once
		r.followBackup, // progress from the worker while the Job runs
		r.complete,     // the version from the Job's report
	)
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
	// Workers finds the worker holding a series whose BackupSeries is gone.
	Workers *Workers
	Now     func() time.Time
}

// Reconcile brings one DataDownload forward, in these steps.
func (r *DataDownloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("datadownload", err) }()
	return runSteps(ctx, &downloadRun{key: req.NamespacedName, o: &o},
		r.load,          // read it; one for another data mover, or one that ended, is left alone
		r.accept,        // a canceled one ends; a new one is checked and accepted
		r.findTarget,    // the target PVC, which Velero creates
		r.rebind,        // once the restored volume was handed over, bind it to the target
		r.findSeries,    // the series of the snapshot, placed, its token loaded
		r.startRestore,  // the restore volume and the RestoreJob, once
		r.followRestore, // the RestoreJob's progress, to its end
		r.handOver,      // keep the restored volume and mark it for the target
	)
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
