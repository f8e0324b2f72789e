package controller

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// ensureNamespaceToken makes the namespace's token Secret, which the series' Jobs mount to
// authenticate to the worker, and with TLS the CA bundle they verify it with. Without the
// bundle no call to a worker can be verified either: the series says why in TokenReady and
// waits, starting nothing.
func (r *BackupSeriesReconciler) ensureNamespaceToken(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	w, err := r.Workers.grantOrWait(ctx, s.bs.Namespace)
	switch {
	case err != nil:
		return failed(err)
	case w == nil:
		return proceed()
	}
	s.o.waiting = true
	if w.warn {
		s.cs.setFalse(backupv1alpha1.ConditionTokenReady, w.reason, w.msg)
	} else {
		s.cs.waiting(backupv1alpha1.ConditionTokenReady, w.reason, w.msg)
	}
	phase := s.bs.Status.Phase
	if phase == "" {
		phase = backupv1alpha1.SeriesPending
	}
	r.finishStatus(s, phase)
	return stop(ctrl.Result{RequeueAfter: w.after}, r.commitStatus(ctx, s))
}

// checkToken sets TokenReady: the worker must know the namespace's token before a Job uses it.
// Until it does, no on-demand backup starts and the series is looked at again soon.
func (r *BackupSeriesReconciler) checkToken(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs, w := s.bs, s.bs.Status.Worker
	tokenReady, terr := r.Workers.TokenAccepted(ctx, w.Media, w.Node, bs.Namespace)
	switch {
	case terr != nil:
		s.o.workerFailed = true
		s.cs.setFalse(backupv1alpha1.ConditionTokenReady, "WorkerError", terr.Error())
	case !tokenReady:
		s.o.waiting = true
		s.cs.waiting(backupv1alpha1.ConditionTokenReady, "TokenPending",
			"waiting for the worker to load the namespace's token (Secret updates reach pods within about a minute)")
	default:
		s.cs.setTrue(backupv1alpha1.ConditionTokenReady, "TokenAccepted", "the worker accepts the token of namespace "+bs.Namespace)
	}
	s.tokenReady = tokenReady
	if !tokenReady {
		s.requeue = min(s.requeue, 5*time.Second)
	}
	return proceed()
}
