package controller

import (
	"context"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
	"github.com/revault-io/revault/operator/internal/workerapi"
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

// place chooses a worker for a series: the worker that already holds it (status is lost when a
// BackupSeries is recreated, e.g. restored from a cluster backup), else the least used reachable
// worker of its media.
func (r *BackupSeriesReconciler) place(ctx context.Context, bs *backupv1alpha1.BackupSeries) (
	_ *backupv1alpha1.WorkerPlacement, reason, msg string, _ error) {
	media := bs.Spec.Storage.Media
	if media == "" {
		media = backupv1alpha1.MediaSSD
	}
	if _, ok := r.Config.Pool(media); !ok {
		return nil, "NoWorker", fmt.Sprintf("the operator runs no %s worker pool", media), nil
	}
	ws, err := r.Workers.List(ctx, media)
	if err != nil {
		return nil, "", "", err
	}
	var all backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &all); err != nil {
		return nil, "", "", err
	}
	placed := map[string]int{}
	for _, x := range all.Items {
		if x.Status.Worker != nil && x.Status.Worker.Media == media {
			placed[x.Status.Worker.Node]++
		}
	}
	var cands []plan.Candidate
	var problems []string
	for _, w := range ws {
		if !w.Ready {
			problems = append(problems, fmt.Sprintf("%s: pod %s not ready", w.Node, w.Pod))
			continue
		}
		api, err := r.Workers.API(ctx, media, w.Node)
		if err != nil {
			return nil, "", "", err
		}
		if _, err := api.Series(ctx, bs.Namespace, bs.Name); err == nil {
			return r.Workers.Placement(w), "Adopted", fmt.Sprintf("the %s worker on node %s already holds series %s",
				media, w.Node, plan.SeriesID(bs.Namespace, bs.Name)), nil
		} else if !workerapi.IsNotFound(err) {
			problems = append(problems, fmt.Sprintf("%s: %v", w.Node, err))
			cands = append(cands, plan.Candidate{Node: w.Node, Pod: w.Pod})
			continue
		}
		s, err := api.Stats(ctx)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", w.Node, err))
		}
		c := plan.Candidate{Node: w.Node, Pod: w.Pod, Reachable: err == nil, Placed: placed[w.Node]}
		if s != nil {
			c.StoredBytes = s.ContainerBytes
		}
		cands = append(cands, c)
	}
	c, ok := plan.ChooseWorker(cands)
	if !ok {
		msg := fmt.Sprintf("no ready %s worker: label nodes %s=%s", media, backupv1alpha1.StorageLabel, media)
		if len(problems) > 0 {
			msg = fmt.Sprintf("no reachable %s worker (%s)", media, joinMax(problems, 4))
		}
		return nil, "NoWorker", msg, nil
	}
	for _, w := range ws {
		if w.Node == c.Node {
			return r.Workers.Placement(w), "WorkerSelected", fmt.Sprintf("least used %s worker: node %s (%d stored bytes, %d series)",
				media, c.Node, c.StoredBytes, c.Placed), nil
		}
	}
	return nil, "", "", fmt.Errorf("chosen worker %s vanished", c.Node)
}

func (r *BackupSeriesReconciler) reconcileCronJob(ctx context.Context, bs *backupv1alpha1.BackupSeries, endpoint string, scheduleOK bool) error {
	want := bs.Spec.Source.PVC != nil && bs.Spec.Schedule != "" && scheduleOK
	cj := plan.BackupCronJob(r.Config, bs, endpoint)
	if !want {
		existing := &batchv1.CronJob{}
		err := r.Get(ctx, client.ObjectKeyFromObject(cj), existing)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if metav1.IsControlledBy(existing, bs) {
			r.Recorder.Event(bs, "Normal", "ScheduleRemoved", "deleted CronJob "+existing.Name)
			return client.IgnoreNotFound(r.Delete(ctx, existing, client.PropagationPolicy(metav1.DeletePropagationBackground)))
		}
		return nil
	}
	if err := controllerutil.SetControllerReference(bs, cj, r.Scheme); err != nil {
		return err
	}
	existing := &batchv1.CronJob{}
	err := r.Get(ctx, client.ObjectKeyFromObject(cj), existing)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := apply(ctx, r.Client, r.Scheme, cj); err != nil {
		return fmt.Errorf("cronjob %s: %w", cj.Name, err)
	}
	if apierrors.IsNotFound(err) {
		r.Recorder.Eventf(bs, "Normal", "ScheduleCreated", "CronJob %s runs backups on %q", cj.Name, bs.Spec.Schedule)
	}
	return nil
}

// backupJobs lists the backup Jobs of a series: those of its label value that name it in full
// (label values are capped, so two long names may share one).
func (r *BackupSeriesReconciler) backupJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries) ([]*batchv1.Job, error) {
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs, client.InNamespace(bs.Namespace),
		client.MatchingLabels{plan.LabelComponent: plan.ComponentBackup, plan.LabelSeries: plan.LabelValue(bs.Name)}); err != nil {
		return nil, err
	}
	var out []*batchv1.Job
	for i := range jobs.Items {
		if j := &jobs.Items[i]; j.Annotations[plan.AnnotationSeries] == bs.Name {
			out = append(out, j)
		}
	}
	return out, nil
}

// observeJobs counts the running backup Jobs of a series and records the newest finished one.
func (r *BackupSeriesReconciler) observeJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries, cs conditionSetter) (int, error) {
	jobs, err := r.backupJobs(ctx, bs)
	if err != nil {
		return 0, err
	}
	active := 0
	var newest *batchv1.Job
	var newestRes jobResult
	for _, j := range jobs {
		res := jobFinished(j)
		if !res.done {
			if j.DeletionTimestamp == nil {
				active++
			}
			continue
		}
		if newest == nil || res.at.After(newestRes.at) || (res.at.Equal(newestRes.at) && j.Name > newest.Name) {
			newest, newestRes = j, res
		}
	}
	st := &bs.Status
	if newest != nil && (st.LastJob == nil || st.LastJob.Name != newest.Name || st.LastJob.Succeeded != newestRes.succeeded) {
		ref := &backupv1alpha1.JobRef{Name: newest.Name, Succeeded: newestRes.succeeded, CompletionTime: &metav1.Time{Time: newestRes.at}}
		if !newestRes.succeeded {
			// On an error reading the output, out is empty and the Job's condition is the message.
			out, _ := jobOutput(ctx, r.Client, r.PodOutput, newest)
			ref.Message = newestRes.failure(out)
		}
		st.LastJob = ref
	}
	if st.LastJob != nil {
		if st.LastJob.Succeeded {
			cs.setTrue(backupv1alpha1.ConditionBackupSucceeded, "JobSucceeded", "backup Job "+st.LastJob.Name+" succeeded")
		} else {
			cs.setFalse(backupv1alpha1.ConditionBackupSucceeded, "JobFailed",
				fmt.Sprintf("backup Job %s failed: %s", st.LastJob.Name, st.LastJob.Message))
		}
	}
	return active, nil
}

// appendBackupNow adds an on-demand backup to the list, keeping the newest MaxBackupNowResults.
func appendBackupNow(list []backupv1alpha1.BackupNowResult, e backupv1alpha1.BackupNowResult) []backupv1alpha1.BackupNowResult {
	list = append(list, e)
	if n := len(list); n > backupv1alpha1.MaxBackupNowResults {
		list = list[n-backupv1alpha1.MaxBackupNowResults:]
	}
	return list
}

// trackBackupNow follows the running on-demand backups of status.backupNow: their progress from the
// worker while the Job runs; the version (from the pod's report) or the error once it ends.
// justStarted names a Job created by this reconcile (the cache may not show it yet). pending: a
// finished Job's report is still on its way (look again soon).
func (r *BackupSeriesReconciler) trackBackupNow(ctx context.Context, bs *backupv1alpha1.BackupSeries, justStarted string) (
	pending bool, _ error) {
	st := &bs.Status
	for i := range st.BackupNow {
		e := &st.BackupNow[i]
		if e.Phase != backupv1alpha1.BackupNowRunning || e.Job == justStarted {
			continue
		}
		job := &batchv1.Job{}
		err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: e.Job}, job)
		if apierrors.IsNotFound(err) {
			now := metav1.Now()
			e.Phase, e.CompletionTime = backupv1alpha1.BackupNowFailed, &now
			e.Message = "Job " + e.Job + " was deleted before it finished"
			continue
		}
		if err != nil {
			return false, err
		}
		res := jobFinished(job)
		if !res.done {
			if st.Worker != nil {
				if n, ok := r.Workers.RunningBackupBytes(ctx, st.Worker, bs.Namespace, bs.Name); ok {
					e.LogicalBytes = n
				}
			}
			continue
		}
		out, oerr := jobOutput(ctx, r.Client, r.PodOutput, job)
		if outputPending(oerr, res.at) {
			// The pod's report is what names the version: try again shortly.
			logf.FromContext(ctx).Info("reading an on-demand backup's report", "job", job.Name, "error", oerr.Error())
			pending = true
			continue
		}
		at := metav1.NewTime(res.at)
		e.CompletionTime = &at
		if !res.succeeded {
			e.Phase, e.Message = backupv1alpha1.BackupNowFailed, res.failure(out)
			continue
		}
		e.Phase = backupv1alpha1.BackupNowSucceeded
		if rep, err := plan.ParsePushReport(out.Report); err == nil && rep.Version != nil {
			e.Version, e.LogicalBytes, e.Message = *rep.Version, rep.LogicalBytes, ""
		} else {
			e.Message = "the backup succeeded but its pod's report could not be read, so its version is unknown"
			if oerr != nil {
				e.Message += ": " + oerr.Error()
			}
		}
	}
	return pending, nil
}

// sync reads the series' versions from its worker into status. A series the worker does not
// know yet (no backup so far) has no versions.
func (r *BackupSeriesReconciler) sync(ctx context.Context, bs *backupv1alpha1.BackupSeries, cs conditionSetter) error {
	st := &bs.Status
	api, err := r.Workers.API(ctx, st.Worker.Media, st.Worker.Node)
	if err != nil {
		return err
	}
	s, err := api.Series(ctx, bs.Namespace, bs.Name)
	switch {
	case workerapi.IsNotFound(err):
		s = &workerapi.Series{}
	case err != nil:
		cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", err.Error())
		return err
	}
	versions := make([]backupv1alpha1.BackupVersion, 0, len(s.VersionList))
	var logical, stored int64
	for _, v := range s.VersionList {
		versions = append(versions, backupv1alpha1.BackupVersion{
			Number: v.Number, Time: metav1.NewTime(v.Time.UTC()), LogicalBytes: v.LogicalBytes,
			NewBytes: v.NewBytes, StoredBytes: v.StoredBytes, Form: backupv1alpha1.VersionForm(v.Form),
		})
		logical += v.LogicalBytes
		stored += v.StoredBytes
	}
	sort.Slice(versions, func(i, j int) bool { return versions[i].Number < versions[j].Number })
	st.VersionCount = int32(len(versions))
	st.LogicalBytes, st.StoredBytes = logical, stored
	st.DedupRatio = plan.Ratio(logical, stored)
	st.LatestVersion, st.LastBackup = 0, nil
	if n := len(versions); n > 0 {
		st.LatestVersion = versions[n-1].Number
		t := versions[n-1].Time
		st.LastBackup = &t
		if n > backupv1alpha1.MaxStatusVersions {
			versions = versions[n-backupv1alpha1.MaxStatusVersions:]
		}
	}
	if len(versions) == 0 {
		versions = nil
	}
	st.Versions = versions

	// A series without a RetentionPolicy keeps everything: clear rules left by a removed one.
	if bs.Spec.RetentionPolicyRef == nil && s.Retention != nil && (s.Retention.Keep != nil || s.Retention.KeepWithinSeconds != nil) {
		if _, err := api.PutRetention(ctx, bs.Namespace, bs.Name, workerapi.Retention{Live: 1}); err != nil {
			cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", "clearing retention: "+err.Error())
			return err
		}
		r.Recorder.Event(bs, "Normal", "RetentionCleared", "no retentionPolicyRef: the worker now keeps every version")
	}
	msg := fmt.Sprintf("%d versions on the %s worker on node %s", st.VersionCount, st.Worker.Media, st.Worker.Node)
	cs.setTrue(backupv1alpha1.ConditionSynced, "WorkerAnswered", msg)
	return nil
}

// finishStatus sets the phase (with an event when it changes), Ready and observedGeneration.
func (r *BackupSeriesReconciler) finishStatus(bs *backupv1alpha1.BackupSeries, phase backupv1alpha1.BackupSeriesPhase) {
	st := &bs.Status
	if st.Phase != phase {
		if st.Phase != "" {
			r.Recorder.Eventf(bs, "Normal", "Phase"+string(phase), "phase %s -> %s", st.Phase, phase)
		}
		st.Phase = phase
	}
	r.Phases.Set(types.NamespacedName{Namespace: bs.Namespace, Name: bs.Name}.String(), string(phase))
	st.ObservedGeneration = bs.Generation
	cs := conditionSetter{rec: r.Recorder, obj: bs, conds: &st.Conditions, generation: bs.Generation}
	for _, t := range []string{backupv1alpha1.ConditionPlaced, backupv1alpha1.ConditionScheduleValid,
		backupv1alpha1.ConditionTokenReady, backupv1alpha1.ConditionSynced, backupv1alpha1.ConditionBackupSucceeded} {
		if c := apimeta.FindStatusCondition(st.Conditions, t); c != nil && c.Status != metav1.ConditionTrue {
			cs.setFalse(backupv1alpha1.ConditionReady, c.Reason, c.Message)
			return
		}
	}
	if st.Worker == nil {
		cs.setFalse(backupv1alpha1.ConditionReady, "NotPlaced", "waiting for a worker")
		return
	}
	cs.setTrue(backupv1alpha1.ConditionReady, "Ready",
		fmt.Sprintf("%d versions, dedup ratio %s", st.VersionCount, orDash(st.DedupRatio)))
}

func (r *BackupSeriesReconciler) writeStatus(ctx context.Context, bs *backupv1alpha1.BackupSeries, orig *backupv1alpha1.BackupSeriesStatus) error {
	if equality.Semantic.DeepEqual(orig, &bs.Status) {
		return nil
	}
	if err := r.Status().Update(ctx, bs); err != nil {
		return err
	}
	// Count a finished backup Job once its record is stored: a conflicting
	// update is retried by a new reconcile, which would count it again.
	if j := bs.Status.LastJob; j != nil && (orig.LastJob == nil || orig.LastJob.Name != j.Name) {
		result := "succeeded"
		if !j.Succeeded {
			result = "failed"
		}
		metrics.BackupJobs.WithLabelValues(result).Inc()
	}
	return nil
}

// finalize honours deletionPolicy and lets the BackupSeries go.
func (r *BackupSeriesReconciler) finalize(ctx context.Context, bs *backupv1alpha1.BackupSeries, o *outcome) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(bs, backupv1alpha1.SeriesFinalizer) {
		return ctrl.Result{}, nil
	}
	key := types.NamespacedName{Namespace: bs.Namespace, Name: bs.Name}.String()
	orig := bs.Status.DeepCopy()
	st := &bs.Status
	cs := conditionSetter{rec: r.Recorder, obj: bs, conds: &st.Conditions, generation: bs.Generation}
	if st.Phase != backupv1alpha1.SeriesDeleting {
		r.Recorder.Eventf(bs, "Normal", "Deleting", "deletionPolicy %s", bs.Spec.DeletionPolicy)
		st.Phase = backupv1alpha1.SeriesDeleting
		r.Phases.Set(key, string(st.Phase))
	}

	if bs.Spec.DeletionPolicy == backupv1alpha1.DeletionDelete && st.Worker != nil {
		// No new backup may start while the data goes: remove the schedule and running Jobs first.
		if err := r.reconcileCronJob(ctx, bs, st.Worker.Endpoint, false); err != nil {
			return ctrl.Result{}, err
		}
		jobs, err := r.backupJobs(ctx, bs)
		if err != nil {
			return ctrl.Result{}, err
		}
		for _, j := range jobs {
			if !jobFinished(j).done {
				if err := r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
					return ctrl.Result{}, err
				}
			}
		}
		api, err := r.Workers.API(ctx, st.Worker.Media, st.Worker.Node)
		if err != nil {
			return ctrl.Result{}, err
		}
		rep, err := api.DeleteSeries(ctx, bs.Namespace, bs.Name)
		switch {
		case workerapi.IsNotFound(err):
			r.Recorder.Event(bs, "Normal", "SeriesDeleted", "the worker holds no data of this series")
		case err != nil:
			o.workerFailed = true
			cs.setFalse(backupv1alpha1.ConditionSynced, "DeleteFailed",
				fmt.Sprintf("deleting the series from the %s worker on node %s: %v", st.Worker.Media, st.Worker.Node, err))
			if werr := r.writeStatus(ctx, bs, orig); werr != nil {
				return ctrl.Result{}, werr
			}
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		default:
			r.Recorder.Eventf(bs, "Normal", "SeriesDeleted", "deleted %d versions from the %s worker on node %s (%d bytes freed)",
				len(rep.Expired), st.Worker.Media, st.Worker.Node, rep.BytesFreed)
		}
	} else if st.Worker != nil {
		r.Recorder.Eventf(bs, "Normal", "DataRetained", "deletionPolicy Retain: series %s stays on the %s worker on node %s",
			plan.SeriesID(bs.Namespace, bs.Name), st.Worker.Media, st.Worker.Node)
	}
	if err := r.writeStatus(ctx, bs, orig); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(bs, backupv1alpha1.SeriesFinalizer)
	if err := r.Update(ctx, bs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.Phases.Set(key, "")
	return ctrl.Result{}, nil
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
