package controller

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// BackupSeriesReconciler places series on workers, runs their backups (a CronJob for the
// schedule, a Job per backup-now request), reads their versions back from the worker, and
// honours the deletion policy.
type BackupSeriesReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	// Reader confirms, uncached, that a referenced RetentionPolicy is gone before its rules are
	// cleared on the worker; nil: the cached client.
	Reader     client.Reader
	Config     *config.Config
	Tokens     *tokens.Manager
	Workers    *Workers
	PodOutput  PodOutputReader
	SyncPeriod time.Duration
	Phases     *metrics.PhaseTracker
	// Now is the clock (when a remote falls behind).
	Now func() time.Time
	// MinFreePercent of a worker's filesystems must stay free for it to take a new series.
	MinFreePercent int
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
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=create
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=revault-ca,verbs=get;update

// seriesRun is one reconcile of a BackupSeries: the object, its status as read (written back only
// when it changed), and what the steps found out for the steps after them.
type seriesRun struct {
	key  types.NamespacedName
	o    *outcome
	bs   *backupv1alpha1.BackupSeries
	orig *backupv1alpha1.BackupSeriesStatus
	cs   conditionSetter
	// events holds the condition and phase events until the status is stored (commitStatus).
	events *heldEvents
	// requeue is the soonest a step wants the series looked at again (at most the sync period).
	requeue time.Duration
	// scheduleOK: the schedule parses, or there is none; zone is the time zone it is read in and
	// next its next run (with a valid schedule).
	scheduleOK bool
	zone       *time.Location
	next       time.Time
	// tokenReady: the worker accepts the namespace's token, so Jobs may start.
	tokenReady bool
	// overQuota: the namespace stores its quota already; no backup starts (checkQuota).
	overQuota bool
	// moving: the series is being moved to another worker; no backup starts (move).
	moving bool
	// startedNow names the backup-now Job this reconcile created (the cache may not show it yet).
	startedNow string
	// active counts the backup Jobs still running.
	active int
	// keepsAll: no RetentionPolicy governs the series (no reference, or the one named is gone),
	// so the worker must keep every version.
	keepsAll bool
	// progress is the worker's word on the series' backup, asked at most once a reconcile
	// (backupProgress); progressAsked says it was.
	progress      *workerclient.BackupProgress
	progressAsked bool
}

// backupProgress is what the series' worker says of its backup (running or queued), asked once
// per reconcile however many steps want it; nil when the worker did not answer or there is none.
func (r *BackupSeriesReconciler) backupProgress(ctx context.Context, s *seriesRun) *workerclient.BackupProgress {
	if !s.progressAsked && s.bs.Status.Worker != nil {
		s.progress = r.Workers.BackupProgress(ctx, s.bs.Status.Worker, s.bs.Namespace, s.bs.Name)
	}
	s.progressAsked = true
	return s.progress
}

// Reconcile brings one BackupSeries forward, in these steps.
func (r *BackupSeriesReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("backupseries", err) }()
	return runSteps(ctx, &seriesRun{key: req.NamespacedName, o: &o, requeue: r.SyncPeriod},
		r.load,                 // read it; a deleted series is finalized instead
		r.checkSchedule,        // ScheduleValid
		r.checkRetentionPolicy, // RetentionPolicyFound
		r.ensureNamespaceToken, // the token Secret the namespace's Jobs mount
		r.placement,            // choose a worker once (and end here to record it), then follow it
		r.checkToken,           // TokenReady: the worker accepts the namespace's token
		r.checkQuota,           // QuotaExceeded: the namespace's revault.io/quota
		r.move,                 // Moving: to another worker (revault.io/move-to, a drained node)
		r.schedule,             // the CronJob of scheduled backups
		r.startBackupNow,       // a Job for a new revault.io/backup-now request
		r.trackBackupNow,       // the on-demand backups under way
		r.observeJobs,          // running backup Jobs and the newest finished one
		r.syncVersions,         // versions and sizes, from the worker
		r.checkOverdue,         // nextBackup, BackupOverdue
		r.finish,               // phase, Ready, and the status write
	)
}

// load reads the series. A deleted one is finalized instead, which ends the reconcile; a live one
// gets the finalizer before anything is made for it, so that its deletion waits for finalize.
func (r *BackupSeriesReconciler) load(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := &backupv1alpha1.BackupSeries{}
	if err := r.Get(ctx, s.key, bs); err != nil {
		if apierrors.IsNotFound(err) {
			r.Phases.Set(s.key.String(), "") // gone: no longer counted in any phase
		}
		return stop(ctrl.Result{}, client.IgnoreNotFound(err))
	}
	if !bs.DeletionTimestamp.IsZero() {
		return stop(r.finalize(ctx, bs, s.o))
	}
	if controllerutil.AddFinalizer(bs, backupv1alpha1.SeriesFinalizer) {
		if err := r.Update(ctx, bs); err != nil {
			return failed(err)
		}
	}
	s.bs, s.orig = bs, bs.Status.DeepCopy()
	s.events = holdEvents(r.Recorder)
	s.cs = conditionSetter{rec: s.events, obj: bs, conds: &bs.Status.Conditions, generation: bs.Generation}
	return proceed()
}

// SetupWithManager watches BackupSeries, their CronJobs and backup and move Jobs (CronJob-made
// Jobs are owned by the CronJob, so Jobs map back by annotation), worker pods, storage Nodes
// (drained or not), Namespaces (quotas) and the RetentionPolicies series reference.
func (r *BackupSeriesReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&backupv1alpha1.BackupSeries{}).
		Owns(&batchv1.CronJob{}).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(seriesOfJob)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.seriesOfWorkerPod)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.seriesOnNode),
			builder.WithPredicates(predicate.AnnotationChangedPredicate{})).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.seriesInNamespace),
			builder.WithPredicates(predicate.AnnotationChangedPredicate{})).
		Watches(&backupv1alpha1.RetentionPolicy{}, handler.EnqueueRequestsFromMapFunc(r.seriesOfPolicy)).
		Complete(r)
}

// seriesOfJob: a backup or move Job's series.
func seriesOfJob(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetAnnotations()[plan.AnnotationSeries]
	if c := o.GetLabels()[plan.LabelComponent]; name == "" || (c != plan.ComponentBackup && c != plan.ComponentMove) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// seriesWhere lists the series (of ns, or all with "") that keep says to look at again.
func (r *BackupSeriesReconciler) seriesWhere(ctx context.Context, ns string, keep func(*backupv1alpha1.BackupSeries) bool,
	opts ...client.ListOption) []reconcile.Request {
	var list backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &list, append(opts, client.InNamespace(ns))...); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if keep(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// seriesOfWorkerPod: a worker pod that appears, becomes ready or goes wakes the series waiting
// for a worker, and the series on that node.
func (r *BackupSeriesReconciler) seriesOfWorkerPod(ctx context.Context, o client.Object) []reconcile.Request {
	pod, ok := o.(*corev1.Pod)
	if !ok || pod.Namespace != r.Config.Namespace || pod.Labels[plan.LabelComponent] != plan.ComponentWorker {
		return nil
	}
	return r.seriesWhere(ctx, "", func(bs *backupv1alpha1.BackupSeries) bool {
		w := bs.Status.Worker
		return w == nil || w.Node == storeNode(pod)
	})
}

// seriesOnNode: a node drained (or no longer) wakes the series placed on its workers.
func (r *BackupSeriesReconciler) seriesOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	return r.seriesWhere(ctx, "", func(bs *backupv1alpha1.BackupSeries) bool {
		return bs.Status.Worker != nil && bs.Status.Worker.Node == o.GetName()
	})
}

// seriesInNamespace: a namespace whose quota annotation changed wakes its series.
func (r *BackupSeriesReconciler) seriesInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.seriesWhere(ctx, o.GetName(), func(*backupv1alpha1.BackupSeries) bool { return true })
}

// seriesOfPolicy: a RetentionPolicy's change wakes the series that reference it.
func (r *BackupSeriesReconciler) seriesOfPolicy(ctx context.Context, o client.Object) []reconcile.Request {
	return r.seriesWhere(ctx, o.GetNamespace(), func(*backupv1alpha1.BackupSeries) bool { return true },
		client.MatchingFields{indexRetentionRef: o.GetName()})
}
