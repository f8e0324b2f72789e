package controller

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

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
	note := recordPullReport(st, out, oerr)
	cs.setTrue(backupv1alpha1.ConditionComplete, "Succeeded",
		fmt.Sprintf("restored version %d (%d bytes) into PVC %s%s", st.ResolvedVersion, st.RestoredBytes, rj.Spec.TargetPVC.ClaimName, note))
	r.setPhase(rj, backupv1alpha1.RestoreSucceeded)
	return ctrl.Result{}, nil
}

// recordPullReport records what the restore pod reported (bytes, container reads, speed factor,
// throughput) in status. When there is no readable report, the restore still succeeded (its Job
// did): note then says why the figures are missing, for the Complete condition.
func recordPullReport(st *backupv1alpha1.RestoreJobStatus, out plan.JobOutput, oerr error) (note string) {
	switch {
	case oerr != nil:
		return fmt.Sprintf(" (report unavailable: %v)", oerr)
	case out.Report == nil:
		return " (the pod left no report)"
	}
	rep, err := plan.ParsePullReport(out.Report)
	if err != nil {
		return fmt.Sprintf(" (unreadable report: %v)", err)
	}
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
	return ""
}
