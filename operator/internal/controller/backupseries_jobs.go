package controller

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// backupJobs lists the backup Jobs of a series: those of its label value that name it in full
// (label values are capped, so two long names may share one).
func (r *BackupSeriesReconciler) backupJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries) ([]*batchv1.Job, error) {
	return r.seriesJobs(ctx, bs, plan.ComponentBackup)
}

// moveJobs are the series' move Jobs.
func (r *BackupSeriesReconciler) moveJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries) ([]*batchv1.Job, error) {
	return r.seriesJobs(ctx, bs, plan.ComponentMove)
}

// seriesJobs are the series' Jobs of one component.
func (r *BackupSeriesReconciler) seriesJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries, component string) ([]*batchv1.Job, error) {
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs, client.InNamespace(bs.Namespace),
		client.MatchingLabels{plan.LabelComponent: component, plan.LabelSeries: plan.LabelValue(bs.Name)}); err != nil {
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

// observeJobs counts the running backup Jobs of a series and records the newest finished one,
// which sets BackupSucceeded.
func (r *BackupSeriesReconciler) observeJobs(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	jobs, err := r.backupJobs(ctx, s.bs)
	if err != nil {
		return failed(err)
	}
	var newest *batchv1.Job
	var newestRes jobResult
	s.active, newest, newestRes = tallyJobs(jobs)
	st := &s.bs.Status
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
			s.cs.setTrue(backupv1alpha1.ConditionBackupSucceeded, "JobSucceeded", "backup Job "+st.LastJob.Name+" succeeded")
		} else {
			s.cs.setFalse(backupv1alpha1.ConditionBackupSucceeded, "JobFailed",
				fmt.Sprintf("backup Job %s failed: %s", st.LastJob.Name, st.LastJob.Message))
		}
	}
	return proceed()
}

// tallyJobs counts the Jobs still running (not those being deleted) and finds the newest finished
// one: the latest to finish; of two that finished in the same second (Kubernetes times have
// seconds only), the later created; the greater name when both tie.
func tallyJobs(jobs []*batchv1.Job) (active int, newest *batchv1.Job, newestRes jobResult) {
	for _, j := range jobs {
		res := jobFinished(j)
		if !res.done {
			if j.DeletionTimestamp == nil {
				active++
			}
			continue
		}
		if newest == nil || newerFinish(j, res, newest, newestRes) {
			newest, newestRes = j, res
		}
	}
	return active, newest, newestRes
}

// newerFinish says whether Job a (finished as ra) is newer than Job b (finished as rb).
func newerFinish(a *batchv1.Job, ra jobResult, b *batchv1.Job, rb jobResult) bool {
	if !ra.at.Equal(rb.at) {
		return ra.at.After(rb.at)
	}
	ca, cb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ca.Equal(cb) {
		return ca.After(cb)
	}
	return a.Name > b.Name
}
