package controller

import (
	"context"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

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
