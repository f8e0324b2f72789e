package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/internal/workerapi"
)

// RestoreJobReconciler resolves a RestoreJob's version on the series' worker, runs a Job that
// pulls it into the target PVC, and reports the result.
type RestoreJobReconciler struct {
	client.Client
	// Reader reads PVCs without a cache (the operator only ever gets single PVCs).
	Reader     client.Reader
	Scheme     *runtime.Scheme
	Recorder   record.EventRecorder
	Config     *config.Config
	Tokens     *tokens.Manager
	Workers    *Workers
	PodOutput  PodOutputReader
	SeriesWait time.Duration
	Now        func() time.Time
}

// +kubebuilder:rbac:groups=backup.revault.io,resources=restorejobs,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=restorejobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get

// Reconcile moves one RestoreJob through Pending, Running, and Succeeded or Failed.
func (r *RestoreJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("restorejob", err) }()

	rj := &backupv1alpha1.RestoreJob{}
	if err := r.Get(ctx, req.NamespacedName, rj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	st := &rj.Status
	if st.Phase == backupv1alpha1.RestoreSucceeded || st.Phase == backupv1alpha1.RestoreFailed {
		return ctrl.Result{}, nil
	}
	orig := st.DeepCopy()
	cs := conditionSetter{rec: r.Recorder, obj: rj, conds: &st.Conditions, generation: rj.Generation}
	st.ObservedGeneration = rj.Generation
	if st.Phase == "" {
		r.setPhase(rj, backupv1alpha1.RestorePending)
	}
	res, err := r.step(ctx, rj, cs, &o)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !equality.Semantic.DeepEqual(orig, st) {
		if err := r.Status().Update(ctx, rj); err != nil {
			return ctrl.Result{}, err
		}
		// Count a finished restore only once its terminal phase is stored: a
		// conflicting update is retried by a new reconcile, which would count
		// it again.
		switch st.Phase {
		case backupv1alpha1.RestoreSucceeded:
			metrics.Restores.WithLabelValues("succeeded").Inc()
		case backupv1alpha1.RestoreFailed:
			metrics.Restores.WithLabelValues("failed").Inc()
		}
	}
	return res, nil
}

func (r *RestoreJobReconciler) step(ctx context.Context, rj *backupv1alpha1.RestoreJob, cs conditionSetter, o *outcome) (ctrl.Result, error) {
	st := &rj.Status
	if st.JobName != "" {
		return r.observe(ctx, rj, cs)
	}

	bs := &backupv1alpha1.BackupSeries{}
	err := r.Get(ctx, types.NamespacedName{Namespace: rj.Namespace, Name: rj.Spec.SeriesRef.Name}, bs)
	if apierrors.IsNotFound(err) {
		msg := fmt.Sprintf("BackupSeries %s not found in namespace %s", rj.Spec.SeriesRef.Name, rj.Namespace)
		if r.Now().Sub(rj.CreationTimestamp.Time) >= r.SeriesWait {
			r.fail(rj, cs, "SeriesNotFound", msg)
			return ctrl.Result{}, nil
		}
		o.waiting = true
		cs.waiting(backupv1alpha1.ConditionComplete, "SeriesNotFound", msg+" (waiting)")
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	w := bs.Status.Worker
	if w == nil {
		o.waiting = true
		cs.waiting(backupv1alpha1.ConditionComplete, "SeriesNotPlaced",
			fmt.Sprintf("BackupSeries %s has no worker yet", bs.Name))
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}

	// Resolve the version once, on the worker that holds the series.
	api, err := r.Workers.API(ctx, w.Media, w.Node)
	if err != nil {
		return ctrl.Result{}, err
	}
	series, err := api.Series(ctx, rj.Namespace, bs.Name)
	if workerapi.IsNotFound(err) {
		// The worker's own message says what is missing.
		r.fail(rj, cs, "VersionNotFound", err.Error())
		return ctrl.Result{}, nil
	}
	if err != nil {
		o.workerFailed = true
		cs.setFalse(backupv1alpha1.ConditionComplete, "WorkerError", err.Error())
		return ctrl.Result{RequeueAfter: 15 * time.Second}, nil
	}
	n, err := plan.ResolveVersion(rj.Spec.Version, plan.SeriesID(rj.Namespace, bs.Name), versionsAt(series))
	if err != nil {
		r.fail(rj, cs, "VersionNotFound", err.Error())
		return ctrl.Result{}, nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: rj.Namespace, Name: rj.Spec.TargetPVC.ClaimName}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			o.waiting = true
			cs.waiting(backupv1alpha1.ConditionComplete, "TargetPVCNotFound",
				fmt.Sprintf("PersistentVolumeClaim %s not found in namespace %s", rj.Spec.TargetPVC.ClaimName, rj.Namespace))
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		}
		return ctrl.Result{}, err
	}

	if err := r.Tokens.EnsureNamespace(ctx, rj.Namespace); err != nil {
		return ctrl.Result{}, fmt.Errorf("namespace token: %w", err)
	}
	ready, err := r.Workers.TokenAccepted(ctx, w.Media, w.Node, rj.Namespace)
	if err != nil || !ready {
		o.waiting = true
		msg := "waiting for the worker to load the namespace's token"
		if err != nil {
			o.workerFailed = true
			msg = err.Error()
		}
		cs.waiting(backupv1alpha1.ConditionComplete, "TokenPending", msg)
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	job := plan.RestoreBatchJob(r.Config, rj, w.Endpoint, n)
	if err := controllerutil.SetControllerReference(rj, job, r.Scheme); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Create(ctx, job); apierrors.IsAlreadyExists(err) {
		// Created by an earlier reconcile whose status write failed: keep the version it
		// restores, which may differ from what "latest" means now.
		existing := &batchv1.Job{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(job), existing); err != nil {
			return ctrl.Result{}, err
		}
		if !metav1.IsControlledBy(existing, rj) {
			r.fail(rj, cs, "JobNameTaken", fmt.Sprintf("a Job named %s exists and does not belong to this RestoreJob", job.Name))
			return ctrl.Result{}, nil
		}
		if v, err := strconv.ParseInt(existing.Annotations[plan.AnnotationVersion], 10, 64); err == nil {
			n = v
		}
	} else if err != nil {
		return ctrl.Result{}, err
	}
	for _, v := range series.VersionList {
		if v.Number == n {
			st.TotalBytes = v.LogicalBytes
		}
	}
	now := metav1.NewTime(r.Now())
	st.JobName, st.ResolvedVersion, st.Worker, st.StartTime = job.Name, n, w.Node, &now
	st.Progress = plan.Percent(0, st.TotalBytes)
	r.Recorder.Eventf(rj, "Normal", "RestoreStarted", "restoring version %d of %s into PVC %s with Job %s",
		n, plan.SeriesID(rj.Namespace, bs.Name), rj.Spec.TargetPVC.ClaimName, job.Name)
	cs.waiting(backupv1alpha1.ConditionComplete, "Running", fmt.Sprintf("Job %s restores version %d", job.Name, n))
	r.setPhase(rj, backupv1alpha1.RestoreRunning)
	return ctrl.Result{}, nil
}

// observe follows the restore Job to its end.
func (r *RestoreJobReconciler) observe(ctx context.Context, rj *backupv1alpha1.RestoreJob, cs conditionSetter) (ctrl.Result, error) {
	st := &rj.Status
	job := &batchv1.Job{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: rj.Namespace, Name: st.JobName}, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.fail(rj, cs, "JobDeleted", fmt.Sprintf("restore Job %s was deleted before it finished", st.JobName))
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	res := jobFinished(job)
	if !res.done {
		return ctrl.Result{}, nil
	}
	out, oerr := jobOutput(ctx, r.Client, r.PodOutput, job)
	if outputPending(oerr, res.at) {
		// The pod's report (bytes, speed factor, or the worker's error) is on its way.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if !res.succeeded {
		r.fail(rj, cs, "RestoreFailed", res.failure(out))
		return ctrl.Result{}, nil
	}
	done := metav1.NewTime(res.at)
	st.CompletionTime = &done
	st.Progress = "100%"
	note := ""
	switch {
	case oerr != nil:
		note = fmt.Sprintf(" (report unavailable: %v)", oerr)
	case out.Report == nil:
		note = " (the pod left no report)"
	default:
		if rep, err := plan.ParsePullReport(out.Report); err != nil {
			note = fmt.Sprintf(" (unreadable report: %v)", err)
		} else {
			st.RestoredBytes = rep.RestoredBytes()
			if rep.Server != nil {
				st.ContainerReads = rep.Server.ContainerReads
				if rep.Server.SpeedFactor != nil {
					st.SpeedFactor = fmt.Sprintf("%.2f", *rep.Server.SpeedFactor)
				}
			}
			if rep.Seconds > 0 {
				bps := float64(st.RestoredBytes) / rep.Seconds
				st.ThroughputBytesPerSecond = int64(bps)
				st.Throughput = plan.Throughput(bps)
			}
			st.Progress = plan.Percent(st.RestoredBytes, max(st.TotalBytes, st.RestoredBytes))
		}
	}
	cs.setTrue(backupv1alpha1.ConditionComplete, "Succeeded",
		fmt.Sprintf("restored version %d (%d bytes) into PVC %s%s", st.ResolvedVersion, st.RestoredBytes, rj.Spec.TargetPVC.ClaimName, note))
	r.setPhase(rj, backupv1alpha1.RestoreSucceeded)
	return ctrl.Result{}, nil
}

func (r *RestoreJobReconciler) fail(rj *backupv1alpha1.RestoreJob, cs conditionSetter, reason, msg string) {
	now := metav1.NewTime(r.Now())
	rj.Status.CompletionTime = &now
	cs.setTrue(backupv1alpha1.ConditionFailed, reason, msg)
	cs.setFalse(backupv1alpha1.ConditionComplete, reason, msg)
	r.setPhase(rj, backupv1alpha1.RestoreFailed)
}

func (r *RestoreJobReconciler) setPhase(rj *backupv1alpha1.RestoreJob, p backupv1alpha1.RestorePhase) {
	if rj.Status.Phase == p {
		return
	}
	from := rj.Status.Phase
	if from == "" {
		from = "New"
	}
	r.Recorder.Eventf(rj, "Normal", "Phase"+string(p), "phase %s -> %s", from, p)
	rj.Status.Phase = p
}

// SetupWithManager watches RestoreJobs and their Jobs.
func (r *RestoreJobReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&backupv1alpha1.RestoreJob{}).
		Owns(&batchv1.Job{}).
		Complete(r)
}
