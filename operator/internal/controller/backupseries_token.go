package controller

import (
	"context"
	"errors"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/certs"
)

// ensureNamespaceToken makes the namespace's token Secret, which the series' Jobs mount to
// authenticate to the worker, and with TLS the CA bundle they verify it with. Without the
// bundle no call to a worker can be verified either: the series says why in TokenReady and
// waits, starting nothing.
func (r *BackupSeriesReconciler) ensureNamespaceToken(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	err := r.Workers.GrantNamespace(ctx, s.bs.Namespace)
	if err == nil {
		return proceed()
	}
	w, ok := credentialsWait(err)
	if !ok {
		return failed(err)
	}
	s.o.waiting = true
	if w.warn {
		s.cs.setFalse(backupv1alpha1.ConditionTokenReady, w.reason, err.Error())
	} else {
		s.cs.waiting(backupv1alpha1.ConditionTokenReady, w.reason, err.Error())
	}
	phase := s.bs.Status.Phase
	if phase == "" {
		phase = backupv1alpha1.SeriesPending
	}
	r.finishStatus(s, phase)
	return stop(ctrl.Result{RequeueAfter: w.after}, r.commitStatus(ctx, s))
}

// credentialsWaitFor is how a series or restore waits for the workers' CA bundle.
type credentialsWaitFor struct {
	reason string
	warn   bool
	after  time.Duration
}

// credentialsWait tells a missing or unusable CA bundle (which a status can explain and only
// an operator's or cert-manager's action fixes) from other errors (retried with backoff).
func credentialsWait(err error) (credentialsWaitFor, bool) {
	switch {
	case errors.Is(err, certs.ErrNotIssued):
		// Just after install, or while cert-manager issues tls.secret.
		return credentialsWaitFor{reason: "CertificatePending", after: 15 * time.Second}, true
	case errors.Is(err, certs.ErrBadBundle):
		return credentialsWaitFor{reason: "CredentialsUnavailable", warn: true, after: 30 * time.Second}, true
	}
	return credentialsWaitFor{}, false
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
