package controller

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// ensureNamespaceToken makes the namespace's token Secret, which the series' Jobs mount to
// authenticate to the worker, and with TLS the CA bundle they verify it with. When it cannot
// (e.g. tls.secret names a Secret without ca.crt), TokenReady says so and no Job starts.
func (r *BackupSeriesReconciler) ensureNamespaceToken(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	s.grantErr = r.Workers.GrantNamespace(ctx, s.bs.Namespace)
	if s.grantErr != nil {
		log.FromContext(ctx).Error(s.grantErr, "providing the namespace's worker credentials")
	}
	return proceed()
}

// checkToken sets TokenReady: the worker must know the namespace's token before a Job uses it.
// Until it does, no on-demand backup starts and the series is looked at again soon.
func (r *BackupSeriesReconciler) checkToken(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs, w := s.bs, s.bs.Status.Worker
	var tokenReady bool
	var terr error
	if s.grantErr == nil {
		tokenReady, terr = r.Workers.TokenAccepted(ctx, w.Media, w.Node, bs.Namespace)
	}
	switch {
	case s.grantErr != nil:
		s.o.waiting = true
		s.cs.setFalse(backupv1alpha1.ConditionTokenReady, "CredentialsUnavailable", s.grantErr.Error())
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
	switch {
	case s.grantErr != nil:
		s.requeue = min(s.requeue, 30*time.Second) // waits for someone to fix a Secret
	case !tokenReady:
		s.requeue = min(s.requeue, 5*time.Second)
	}
	return proceed()
}
