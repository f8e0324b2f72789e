package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
)

// The long reconcilers are written as ordered steps. Each step does one part of the work (check
// the schedule, place the series, start a backup, ...) on a run value that carries the object and
// what the earlier steps found out. A step says whether the reconcile ends with it: done, with
// the result to return (a requeue after a status write) or an error. Otherwise the next step
// runs. A Reconcile then reads as the list of what it does, in order, and each step can be read
// (and changed) on its own.

// step is one part of a reconcile of a run R. An error always comes with done.
type step[R any] func(ctx context.Context, run R) (res ctrl.Result, done bool, err error)

// runSteps runs the steps in order until one is done or fails, and returns what that one
// returned; when every step proceeds it returns an empty result, and the caller decides what
// follows (WorkerPool's Reconcile then requeues on its own).
func runSteps[R any](ctx context.Context, run R, steps ...step[R]) (ctrl.Result, error) {
	for _, s := range steps {
		if res, done, err := s(ctx, run); done || err != nil {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

// proceed: this step is over and the next one runs.
func proceed() (ctrl.Result, bool, error) { return ctrl.Result{}, false, nil }

// proceedUnless proceeds when err is nil, and otherwise fails with it.
func proceedUnless(err error) (ctrl.Result, bool, error) {
	if err != nil {
		return failed(err)
	}
	return proceed()
}

// stop ends the reconcile with res and err.
func stop(res ctrl.Result, err error) (ctrl.Result, bool, error) { return res, true, err }

// failed ends the reconcile with err, which controller-runtime retries with backoff.
func failed(err error) (ctrl.Result, bool, error) { return ctrl.Result{}, true, err }
