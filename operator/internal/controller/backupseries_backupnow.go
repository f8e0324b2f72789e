package controller

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// startBackupNow answers a new revault.io/backup-now request: a PVC series gets a backup Job once
// its worker accepts the namespace's token (the request waits until then); an external series is
// pushed by its producer, so the request is recorded as failed.
func (r *BackupSeriesReconciler) startBackupNow(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs, st := s.bs, &s.bs.Status
	req := bs.Annotations[backupv1alpha1.BackupNowAnnotation]
	isNew := req != "" && req != st.LastBackupNow
	// A request made while the series moves waits for the move to end, and then runs there.
	if !isNew || (bs.Spec.Source.PVC != nil && (!s.tokenReady || s.moving)) {
		return proceed()
	}
	now := metav1.Now()
	switch {
	case s.overQuota && bs.Spec.Source.PVC != nil:
		msg := "the namespace is over its quota (" + backupv1alpha1.QuotaAnnotation + "): " +
			apimeta.FindStatusCondition(st.Conditions, backupv1alpha1.ConditionQuotaExceeded).Message
		r.Recorder.Event(bs, "Warning", "BackupNowRefused", truncate(msg, 1024))
		st.BackupNow = appendBackupNow(st.BackupNow, backupv1alpha1.BackupNowResult{
			Request: req, Phase: backupv1alpha1.BackupNowFailed, StartTime: &now, CompletionTime: &now, Message: truncate(msg, 1024),
		})
	case bs.Spec.Source.PVC == nil:
		r.Recorder.Event(bs, "Warning", "BackupNowIgnored",
			"external series are pushed by their producer; the backup-now annotation is ignored")
		st.BackupNow = appendBackupNow(st.BackupNow, backupv1alpha1.BackupNowResult{
			Request: req, Phase: backupv1alpha1.BackupNowFailed, StartTime: &now, CompletionTime: &now,
			Message: "external series are pushed by their producer: the backup-now annotation is ignored",
		})
	default:
		job := plan.BackupNowJob(r.Config, bs, st.Worker.Endpoint, req)
		if err := controllerutil.SetControllerReference(bs, job, r.Scheme); err != nil {
			return failed(err)
		}
		if err := r.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return failed(err)
		}
		r.Recorder.Eventf(bs, "Normal", "BackupStarted", "on-demand backup %q: Job %s", req, job.Name)
		st.BackupNow = appendBackupNow(st.BackupNow, backupv1alpha1.BackupNowResult{
			Request: req, Job: job.Name, Phase: backupv1alpha1.BackupNowRunning, StartTime: &now,
		})
		s.startedNow = job.Name
	}
	st.LastBackupNow = req
	return proceed()
}

// appendBackupNow adds an on-demand backup to the list, keeping the newest MaxBackupNowResults.
func appendBackupNow(list []backupv1alpha1.BackupNowResult, e backupv1alpha1.BackupNowResult) []backupv1alpha1.BackupNowResult {
	list = append(list, e)
	if n := len(list); n > backupv1alpha1.MaxBackupNowResults {
		list = list[n-backupv1alpha1.MaxBackupNowResults:]
	}
	return list
}

// trackBackupNow follows the running on-demand backups of status.backupNow, except the one this
// reconcile started (the cache may not show its Job yet). When a finished Job's report is still
// on its way, the series is looked at again soon.
func (r *BackupSeriesReconciler) trackBackupNow(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	pending := false
	for i := range st.BackupNow {
		e := &st.BackupNow[i]
		if e.Phase != backupv1alpha1.BackupNowRunning || e.Job == s.startedNow {
			continue
		}
		p, err := r.followBackupNow(ctx, s, e)
		if err != nil {
			return failed(err)
		}
		pending = pending || p
	}
	if pending {
		s.requeue = min(s.requeue, time.Second)
	}
	return proceed()
}

// followBackupNow brings one running on-demand backup forward: its progress from the worker while
// the Job runs; the version (from the pod's report) or the error once it ends. pending: the Job
// finished but its report is not readable yet.
func (r *BackupSeriesReconciler) followBackupNow(ctx context.Context, s *seriesRun,
	e *backupv1alpha1.BackupNowResult) (pending bool, _ error) {
	bs := s.bs
	job := &batchv1.Job{}
	err := r.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: e.Job}, job)
	if apierrors.IsNotFound(err) {
		now := metav1.Now()
		e.Phase, e.CompletionTime = backupv1alpha1.BackupNowFailed, &now
		e.Message = "Job " + e.Job + " was deleted before it finished"
		return false, nil
	}
	if err != nil {
		return false, err
	}
	res := jobFinished(job)
	if !res.done {
		if n, ok := readBytes(r.backupProgress(ctx, s)); ok {
			e.LogicalBytes = n
		}
		return false, nil
	}
	out, oerr := jobOutput(ctx, r.Client, r.PodOutput, job)
	if outputPending(oerr, res.at) {
		// The pod's report is what names the version: try again shortly.
		logf.FromContext(ctx).Info("reading an on-demand backup's report", "job", job.Name, "error", oerr.Error())
		return true, nil
	}
	at := metav1.NewTime(res.at)
	e.CompletionTime = &at
	if !res.succeeded {
		e.Phase, e.Message = backupv1alpha1.BackupNowFailed, res.failure(out)
		return false, nil
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
	return false, nil
}
