package controller

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
)

// BackupSeriesReconciler places series on workers, runs their backups (a CronJob for the
// schedule, a Job per backup-now request), reads their versions back from the worker, and
// honours the deletion policy.
type BackupSeriesReconciler struct {
	client.Client
	Scheme     *runtime.Scheme
	Recorder   record.EventRecorder
	Config     *config.Config
	Tokens     *tokens.Manager
	Workers    *Workers
	PodOutput  PodOutputReader
	SyncPeriod time.Duration
	Phases     *metrics.PhaseTracker
}

// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries/finalizers,verbs=update
// +kubebuilder:rbac:groups=backup.revault.io,resources=retentionpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/log,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=revault-token,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile brings one BackupSeries forward.
func (r *BackupSeriesReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("backupseries", err) }()
	log := logf.FromContext(ctx)

	bs := &backupv1alpha1.BackupSeries{}
	if err := r.Get(ctx, req.NamespacedName, bs); err != nil {
		if apierrors.IsNotFound(err) {
			r.Phases.Set(req.String(), "")
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !bs.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, bs, &o)
	}
	if controllerutil.AddFinalizer(bs, backupv1alpha1.SeriesFinalizer) {
		if err := r.Update(ctx, bs); err != nil {
			return ctrl.Result{}, err
		}
	}

	orig := bs.Status.DeepCopy()
	st := &bs.Status
	cs := conditionSetter{rec: r.Recorder, obj: bs, conds: &st.Conditions, generation: bs.Generation}
	requeue := r.SyncPeriod

	// Schedule: the CRD checks its shape; the cron parser catches the rest.
	scheduleOK := true
	if bs.Spec.Schedule == "" {
		cs.setTrue(backupv1alpha1.ConditionScheduleValid, "OnDemand", "no schedule: backups run on the revault.io/backup-now annotation")
	} else if _, perr := plan.ParseSchedule(bs.Spec.Schedule); perr != nil {
		scheduleOK = false
		cs.setFalse(backupv1alpha1.ConditionScheduleValid, "InvalidSchedule", perr.Error())
	} else {
		cs.setTrue(backupv1alpha1.ConditionScheduleValid, "Scheduled", "backups run on "+bs.Spec.Schedule)
	}

	// Retention policy reference (the RetentionPolicy controller pushes it to the worker).
	if ref := bs.Spec.RetentionPolicyRef; ref != nil {
		rp := &backupv1alpha1.RetentionPolicy{}
		err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: ref.Name}, rp)
		switch {
		case apierrors.IsNotFound(err):
			cs.setFalse(backupv1alpha1.ConditionRetentionPolicyFound, "NotFound",
				fmt.Sprintf("RetentionPolicy %s not found in namespace %s: every version is kept", ref.Name, bs.Namespace))
		case err != nil:
			return ctrl.Result{}, err
		default:
			cs.setTrue(backupv1alpha1.ConditionRetentionPolicyFound, "Found", "RetentionPolicy "+ref.Name)
		}
	} else {
		apimeta.RemoveStatusCondition(&st.Conditions, backupv1alpha1.ConditionRetentionPolicyFound)
	}

	if err := r.Tokens.EnsureNamespace(ctx, bs.Namespace); err != nil {
		return ctrl.Result{}, fmt.Errorf("namespace token: %w", err)
	}

	// Placement: once chosen, a series stays on its worker (the worker holds its data).
	if st.Worker == nil {
		p, reason, msg, werr := r.place(ctx, bs)
		if werr != nil {
			return ctrl.Result{}, werr
		}
		if p == nil {
			o.waiting = true
			cs.setFalse(backupv1alpha1.ConditionPlaced, reason, msg)
			r.finishStatus(bs, backupv1alpha1.SeriesPending)
			return ctrl.Result{RequeueAfter: 15 * time.Second}, r.writeStatus(ctx, bs, orig)
		}
		st.Worker = p
		log.Info("placed series", "node", p.Node, "media", p.Media)
		cs.setTrue(backupv1alpha1.ConditionPlaced, reason, msg)
		// Record the placement before anything (a Job, a CronJob) uses it: if this write
		// fails, nothing points at the chosen worker yet and the next reconcile chooses again.
		st.ObservedGeneration = bs.Generation
		return ctrl.Result{RequeueAfter: time.Second}, r.writeStatus(ctx, bs, orig)
	} else {
		w, ok, lerr := r.Workers.OnNode(ctx, st.Worker.Media, st.Worker.Node)
		if lerr != nil {
			return ctrl.Result{}, lerr
		}
		switch {
		case !ok:
			cs.setFalse(backupv1alpha1.ConditionPlaced, "WorkerMissing",
				fmt.Sprintf("no %s worker pod on node %s: the series' data is there; backups wait for it", st.Worker.Media, st.Worker.Node))
		case !w.Ready:
			st.Worker.Pod = w.Pod
			cs.setFalse(backupv1alpha1.ConditionPlaced, "WorkerNotReady",
				fmt.Sprintf("worker pod %s on node %s is not ready", w.Pod, w.Node))
		default:
			st.Worker.Pod = w.Pod
			cs.setTrue(backupv1alpha1.ConditionPlaced, "WorkerSelected",
				fmt.Sprintf("%s worker on node %s (pod %s)", w.Media, w.Node, w.Pod))
		}
	}
	endpoint := st.Worker.Endpoint

	// The worker must know the namespace's token before a Job uses it.
	tokenReady, terr := r.Workers.TokenAccepted(ctx, st.Worker.Media, st.Worker.Node, bs.Namespace)
	switch {
	case terr != nil:
		o.workerFailed = true
		cs.setFalse(backupv1alpha1.ConditionTokenReady, "WorkerError", terr.Error())
	case !tokenReady:
		o.waiting = true
		cs.waiting(backupv1alpha1.ConditionTokenReady, "TokenPending",
			"waiting for the worker to load the namespace's token (Secret updates reach pods within about a minute)")
	default:
		cs.setTrue(backupv1alpha1.ConditionTokenReady, "TokenAccepted", "the worker accepts the token of namespace "+bs.Namespace)
	}
	if !tokenReady {
		requeue = min(requeue, 5*time.Second)
	}

	// Scheduled backups.
	if err := r.reconcileCronJob(ctx, bs, endpoint, scheduleOK); err != nil {
		return ctrl.Result{}, err
	}

	// On-demand backups.
	startedNow := ""
	if req := bs.Annotations[backupv1alpha1.BackupNowAnnotation]; req != "" && req != st.LastBackupNow &&
		(tokenReady || bs.Spec.Source.PVC == nil) {
		now := metav1.Now()
		if bs.Spec.Source.PVC == nil {
			r.Recorder.Event(bs, "Warning", "BackupNowIgnored",
				"external series are pushed by their producer; the backup-now annotation is ignored")
			st.BackupNow = appendBackupNow(st.BackupNow, backupv1alpha1.BackupNowResult{
				Request: req, Phase: backupv1alpha1.BackupNowFailed, StartTime: &now, CompletionTime: &now,
				Message: "external series are pushed by their producer: the backup-now annotation is ignored",
			})
		} else {
			job := plan.BackupNowJob(r.Config, bs, endpoint, req)
			if err := controllerutil.SetControllerReference(bs, job, r.Scheme); err != nil {
				return ctrl.Result{}, err
			}
			if err := r.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
				return ctrl.Result{}, err
			}
			r.Recorder.Eventf(bs, "Normal", "BackupStarted", "on-demand backup %q: Job %s", req, job.Name)
			st.BackupNow = appendBackupNow(st.BackupNow, backupv1alpha1.BackupNowResult{
				Request: req, Job: job.Name, Phase: backupv1alpha1.BackupNowRunning, StartTime: &now,
			})
			startedNow = job.Name
		}
		st.LastBackupNow = req
	}
	if pending, err := r.trackBackupNow(ctx, bs, startedNow); err != nil {
		return ctrl.Result{}, err
	} else if pending {
		requeue = min(requeue, time.Second)
	}

	// Backup Jobs: running ones and the newest finished one.
	active, err := r.observeJobs(ctx, bs, cs)
	if err != nil {
		return ctrl.Result{}, err
	}

	// Versions and sizes, from the worker.
	if werr := r.sync(ctx, bs, cs); werr != nil {
		o.workerFailed = true
		requeue = min(requeue, 30*time.Second)
	}

	phase := backupv1alpha1.SeriesReady
	switch {
	case active > 0:
		phase = backupv1alpha1.SeriesBackingUp
	case st.LastJob != nil && !st.LastJob.Succeeded:
		phase = backupv1alpha1.SeriesFailed
	}
	r.finishStatus(bs, phase)
	if active > 0 {
		requeue = min(requeue, 10*time.Second)
	}
	return ctrl.Result{RequeueAfter: requeue}, r.writeStatus(ctx, bs, orig)
}

// SetupWithManager watches BackupSeries, their CronJobs and backup Jobs (CronJob-made Jobs are
// owned by the CronJob, so Jobs map back by label), and RetentionPolicies they reference.
func (r *BackupSeriesReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&backupv1alpha1.BackupSeries{}).
		Owns(&batchv1.CronJob{}).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name := o.GetAnnotations()[plan.AnnotationSeries]
			if name == "" || o.GetLabels()[plan.LabelComponent] != plan.ComponentBackup {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		})).
		// A worker pod that appears, becomes ready or goes: series waiting for a worker, and
		// the series on that node.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			pod, ok := o.(*corev1.Pod)
			if !ok || pod.Namespace != r.Config.Namespace || pod.Labels[plan.LabelComponent] != plan.ComponentWorker {
				return nil
			}
			var list backupv1alpha1.BackupSeriesList
			if err := r.List(ctx, &list); err != nil {
				return nil
			}
			var reqs []reconcile.Request
			for _, bs := range list.Items {
				if w := bs.Status.Worker; w == nil || w.Node == pod.Spec.NodeName {
					reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&bs)})
				}
			}
			return reqs
		})).
		Watches(&backupv1alpha1.RetentionPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list backupv1alpha1.BackupSeriesList
			if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()),
				client.MatchingFields{indexRetentionRef: o.GetName()}); err != nil {
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for _, bs := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&bs)})
			}
			return reqs
		})).
		Complete(r)
}
