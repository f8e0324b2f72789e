package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// restoreStart is the start of one RestoreJob: the object, and what the steps found on the way to
// its restore Job.
type restoreStart struct {
	rj *backupv1alpha1.RestoreJob
	cs conditionSetter
	o  *outcome
	// bs is the series (findSeries) and w its worker; series is what that worker reports of it
	// and version the number restored (resolveVersion).
	bs      *backupv1alpha1.BackupSeries
	w       *backupv1alpha1.WorkerPlacement
	series  *workerclient.SeriesDetail
	version int64
	// job is the restore Job (startJob).
	job *batchv1.Job
}

// findSeries finds the RestoreJob's BackupSeries and its worker. A series that does not exist
// may still be on its way (e.g. restored from a cluster backup together with the RestoreJob):
// the RestoreJob waits for it up to SeriesWait after its creation, then fails.
func (r *RestoreJobReconciler) findSeries(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj := s.rj
	bs := &backupv1alpha1.BackupSeries{}
	err := r.Get(ctx, types.NamespacedName{Namespace: rj.Namespace, Name: rj.Spec.SeriesRef.Name}, bs)
	if apierrors.IsNotFound(err) {
		msg := fmt.Sprintf("BackupSeries %s not found in namespace %s", rj.Spec.SeriesRef.Name, rj.Namespace)
		if r.Now().Sub(rj.CreationTimestamp.Time) >= r.SeriesWait {
			r.fail(rj, s.cs, "SeriesNotFound", msg)
			return stop(ctrl.Result{}, nil)
		}
		s.o.waiting = true
		s.cs.waiting(backupv1alpha1.ConditionComplete, "SeriesNotFound", msg+" (waiting)")
		return stop(ctrl.Result{RequeueAfter: 5 * time.Second}, nil)
	}
	if err != nil {
		return failed(err)
	}
	if bs.Status.Worker == nil {
		s.o.waiting = true
		s.cs.waiting(backupv1alpha1.ConditionComplete, "SeriesNotPlaced",
			fmt.Sprintf("BackupSeries %s has no worker yet", bs.Name))
		return stop(ctrl.Result{RequeueAfter: 10 * time.Second}, nil)
	}
	s.bs, s.w = bs, bs.Status.Worker
	return proceed()
}

// resolveVersion resolves the requested version once, on the worker that holds the series: a
// restore that started keeps its version even when "latest" moves on.
func (r *RestoreJobReconciler) resolveVersion(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj := s.rj
	api, err := r.Workers.API(ctx, s.w.Media, s.w.Node)
	if err != nil {
		return failed(err)
	}
	series, err := api.Series(ctx, rj.Namespace, s.bs.Name)
	if workerclient.IsNotFound(err) {
		// The worker's own message says what is missing.
		r.fail(rj, s.cs, "VersionNotFound", err.Error())
		return stop(ctrl.Result{}, nil)
	}
	if err != nil {
		s.o.workerFailed = true
		s.cs.setFalse(backupv1alpha1.ConditionComplete, "WorkerError", err.Error())
		return stop(ctrl.Result{RequeueAfter: 15 * time.Second}, nil)
	}
	n, err := plan.ResolveVersion(rj.Spec.Version, plan.SeriesID(rj.Namespace, s.bs.Name), versionsAt(series))
	if err != nil {
		r.fail(rj, s.cs, "VersionNotFound", err.Error())
		return stop(ctrl.Result{}, nil)
	}
	s.series, s.version = series, n
	return proceed()
}

// findTarget waits for the target PVC.
func (r *RestoreJobReconciler) findTarget(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj := s.rj
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: rj.Namespace, Name: rj.Spec.TargetPVC.ClaimName}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			s.o.waiting = true
			s.cs.waiting(backupv1alpha1.ConditionComplete, "TargetPVCNotFound",
				fmt.Sprintf("PersistentVolumeClaim %s not found in namespace %s", rj.Spec.TargetPVC.ClaimName, rj.Namespace))
			return stop(ctrl.Result{RequeueAfter: 10 * time.Second}, nil)
		}
		return failed(err)
	}
	return proceed()
}

// grant makes the namespace's token Secret and CA bundle, which the restore Job mounts; without
// the bundle (tls.secret missing, not issued yet) the restore waits and says why.
func (r *RestoreJobReconciler) grant(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	w, err := r.Workers.grantOrWait(ctx, s.rj.Namespace)
	switch {
	case err != nil:
		return failed(err)
	case w == nil:
		return proceed()
	}
	s.o.waiting = true
	s.cs.waiting(backupv1alpha1.ConditionComplete, w.reason, w.msg)
	return stop(ctrl.Result{RequeueAfter: w.after}, nil)
}

// checkToken waits until the worker accepts the namespace's token.
func (r *RestoreJobReconciler) checkToken(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj := s.rj
	ready, err := r.Workers.TokenAccepted(ctx, s.w.Media, s.w.Node, rj.Namespace)
	if err != nil || !ready {
		s.o.waiting = true
		msg := "waiting for the worker to load the namespace's token"
		if err != nil {
			s.o.workerFailed = true
			msg = err.Error()
		}
		s.cs.waiting(backupv1alpha1.ConditionComplete, "TokenPending", msg)
		return stop(ctrl.Result{RequeueAfter: 5 * time.Second}, nil)
	}
	return proceed()
}

// startJob creates the Job that pulls the version into the target PVC. A Job of that name that
// this RestoreJob owns was created by an earlier reconcile whose status write failed: it is kept,
// with the version it restores, which may differ from what "latest" means now.
func (r *RestoreJobReconciler) startJob(ctx context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj := s.rj
	job := plan.RestoreBatchJob(r.Config, rj, s.w.Endpoint, s.version)
	if err := controllerutil.SetControllerReference(rj, job, r.Scheme); err != nil {
		return failed(err)
	}
	err := r.Create(ctx, job)
	switch {
	case apierrors.IsAlreadyExists(err):
		existing := &batchv1.Job{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(job), existing); err != nil {
			return failed(err)
		}
		if !metav1.IsControlledBy(existing, rj) {
			r.fail(rj, s.cs, "JobNameTaken", fmt.Sprintf("a Job named %s exists and does not belong to this RestoreJob", job.Name))
			return stop(ctrl.Result{}, nil)
		}
		if v, err := strconv.ParseInt(existing.Annotations[plan.AnnotationVersion], 10, 64); err == nil {
			s.version = v
		}
	case err != nil:
		return failed(err)
	}
	s.job = job
	return proceed()
}

// markRunning records the started restore in status (its Job, version, worker and size), and
// moves the RestoreJob to Running.
func (r *RestoreJobReconciler) markRunning(_ context.Context, s *restoreStart) (ctrl.Result, bool, error) {
	rj, st, n := s.rj, &s.rj.Status, s.version
	for _, v := range s.series.VersionList {
		if v.Number == n {
			st.TotalBytes = v.LogicalBytes
		}
	}
	now := metav1.NewTime(r.Now())
	st.JobName, st.ResolvedVersion, st.Worker, st.StartTime = s.job.Name, n, s.w.Node, &now
	st.Progress = plan.Percent(0, st.TotalBytes)
	r.Recorder.Eventf(rj, "Normal", "RestoreStarted", "restoring version %d of %s into PVC %s with Job %s",
		n, plan.SeriesID(rj.Namespace, s.bs.Name), rj.Spec.TargetPVC.ClaimName, s.job.Name)
	s.cs.waiting(backupv1alpha1.ConditionComplete, "Running", fmt.Sprintf("Job %s restores version %d", s.job.Name, n))
	r.setPhase(rj, backupv1alpha1.RestoreRunning)
	return stop(ctrl.Result{}, nil)
}
