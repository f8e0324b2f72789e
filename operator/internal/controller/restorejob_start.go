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
	"github.com/revault-io/revault/operator/internal/workerapi"
)

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
