package controller

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/tokens"
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
	res, err := r.advance(ctx, rj, cs, &o)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !equality.Semantic.DeepEqual(orig, st) {
		if err := patchStatus(ctx, r.Client, rj, func(base *backupv1alpha1.RestoreJob) { base.Status = *orig }); err != nil {
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

// advance starts the restore, in these steps, or follows the Job that was started.
func (r *RestoreJobReconciler) advance(ctx context.Context, rj *backupv1alpha1.RestoreJob, cs conditionSetter, o *outcome) (ctrl.Result, error) {
	if rj.Status.JobName != "" {
		return r.observe(ctx, rj, cs)
	}
	return runSteps(ctx, &restoreStart{rj: rj, cs: cs, o: o},
		r.findSeries,     // the BackupSeries and its worker
		r.grant,          // the namespace's token and CA bundle (needed to verify the worker too)
		r.resolveVersion, // the version to restore, resolved once on that worker
		r.findTarget,     // the target PVC
		r.checkToken,     // the worker accepts the namespace's token
		r.startJob,       // the Job that pulls the version into the PVC
		r.markRunning,    // status: Running, with the Job and version
	)
}

// fail ends the RestoreJob: Failed, with reason and msg in its conditions.
func (r *RestoreJobReconciler) fail(rj *backupv1alpha1.RestoreJob, cs conditionSetter, reason, msg string) {
	now := metav1.NewTime(r.Now())
	rj.Status.CompletionTime = &now
	cs.setTrue(backupv1alpha1.ConditionFailed, reason, msg)
	cs.setFalse(backupv1alpha1.ConditionComplete, reason, msg)
	r.setPhase(rj, backupv1alpha1.RestoreFailed)
}

// setPhase moves the RestoreJob to phase p, with an event.
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
