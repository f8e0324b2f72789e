package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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

// finalize honours deletionPolicy and lets the BackupSeries go.
func (r *BackupSeriesReconciler) finalize(ctx context.Context, bs *backupv1alpha1.BackupSeries, o *outcome) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(bs, backupv1alpha1.SeriesFinalizer) {
		return ctrl.Result{}, nil
	}
	key := types.NamespacedName{Namespace: bs.Namespace, Name: bs.Name}.String()
	orig := bs.Status.DeepCopy()
	st := &bs.Status
	cs := conditionSetter{rec: r.Recorder, obj: bs, conds: &st.Conditions, generation: bs.Generation}
	if st.Phase != backupv1alpha1.SeriesDeleting {
		r.Recorder.Eventf(bs, "Normal", "Deleting", "deletionPolicy %s", bs.Spec.DeletionPolicy)
		st.Phase = backupv1alpha1.SeriesDeleting
		r.Phases.Set(key, string(st.Phase))
	}

	if st.Worker != nil {
		if bs.Spec.DeletionPolicy == backupv1alpha1.DeletionDelete {
			if res, done, err := r.deleteData(ctx, bs, orig, cs, o); done {
				return res, err
			}
		} else {
			var where []string
			for _, at := range copiesOf(bs) {
				where = append(where, fmt.Sprintf("the %s worker on node %s", at.Media, at.Node))
			}
			r.Recorder.Eventf(bs, "Normal", "DataRetained", "deletionPolicy Retain: series %s stays on %s",
				plan.SeriesID(bs.Namespace, bs.Name), strings.Join(where, " and on "))
		}
	}
	if err := r.writeStatus(ctx, bs, orig); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(bs, backupv1alpha1.SeriesFinalizer)
	if err := r.Update(ctx, bs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.Phases.Set(key, "")
	return ctrl.Result{}, nil
}

// deleteData deletes the series from its worker (deletionPolicy Delete). When the worker fails,
// it is done: Synced says why and the deletion is tried again later, the finalizer still in place.
func (r *BackupSeriesReconciler) deleteData(ctx context.Context, bs *backupv1alpha1.BackupSeries,
	orig *backupv1alpha1.BackupSeriesStatus, cs conditionSetter, o *outcome) (ctrl.Result, bool, error) {
	if err := r.stopBackups(ctx, bs); err != nil {
		return failed(err)
	}
	// A move's copy is deleted only once its Job and pod are gone: a pod still uploading could
	// otherwise commit a version on the destination after the deletion.
	if moving, err := r.stopMoves(ctx, bs); err != nil || moving {
		return stop(ctrl.Result{RequeueAfter: 5 * time.Second}, err)
	}
	for i, at := range copiesOf(bs) {
		if i > 0 {
			// Another worker's copy is skipped only when no worker serves that store (an
			// adopted one still does) and its node is no longer a storage node.
			_, found, err := r.Workers.OnNode(ctx, at.Media, at.Node)
			if err != nil {
				return failed(err)
			}
			if gone, err := r.storeGone(ctx, at.Node); err != nil {
				return failed(err)
			} else if gone && !found {
				continue
			}
		}
		api, err := r.Workers.API(ctx, at.Media, at.Node)
		if err != nil {
			return failed(err)
		}
		rep, err := api.DeleteSeries(ctx, bs.Namespace, bs.Name)
		switch {
		case workerclient.IsNotFound(err):
			r.Recorder.Eventf(bs, "Normal", "SeriesDeleted", "the %s worker on node %s holds no data of this series", at.Media, at.Node)
		case err != nil:
			o.workerFailed = true
			cs.setFalse(backupv1alpha1.ConditionSynced, "DeleteFailed",
				fmt.Sprintf("deleting the series from the %s worker on node %s: %v", at.Media, at.Node, err))
			if werr := r.writeStatus(ctx, bs, orig); werr != nil {
				return failed(werr)
			}
			return stop(ctrl.Result{RequeueAfter: 10 * time.Second}, nil)
		default:
			r.Recorder.Eventf(bs, "Normal", "SeriesDeleted", "deleted %d versions from the %s worker on node %s (%d bytes freed)",
				len(rep.Expired), at.Media, at.Node, rep.BytesFreed)
		}
	}
	return proceed()
}

// copiesOf lists the workers that may hold the series' data: its own, the one its placement
// record names (the same but for a move's switch that did not reach the status), and during or
// after a move the destination being filled (revault.io/moving-to) and the source not yet
// emptied (revault.io/moved-from).
func copiesOf(bs *backupv1alpha1.BackupSeries) []plan.StoreRef {
	out := []plan.StoreRef{plan.StoreOf(bs.Status.Worker)}
	for _, k := range []string{backupv1alpha1.PlacementAnnotation, backupv1alpha1.MovingAnnotation, backupv1alpha1.MovedFromAnnotation} {
		if ref, ok := plan.StoreOfRecord(bs.Annotations[k]); ok && !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	return out
}

// stopBackups deletes the series' CronJob and its running backup Jobs: no new backup may start
// while its data goes.
func (r *BackupSeriesReconciler) stopBackups(ctx context.Context, bs *backupv1alpha1.BackupSeries) error {
	if err := r.reconcileCronJob(ctx, bs, bs.Status.Worker.Endpoint, false, false); err != nil {
		return err
	}
	jobs, err := r.backupJobs(ctx, bs)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if !jobFinished(j).done {
			if err := r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

// stopMoves deletes the series' move Jobs; true while one, or a pod of one, is still there and
// running (its upload could still commit a version).
func (r *BackupSeriesReconciler) stopMoves(ctx context.Context, bs *backupv1alpha1.BackupSeries) (bool, error) {
	jobs, err := r.moveJobs(ctx, bs)
	if err != nil {
		return false, err
	}
	running := len(jobs) > 0
	for _, j := range jobs {
		if j.DeletionTimestamp == nil {
			if err := r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return true, err
			}
		}
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(bs.Namespace), client.MatchingLabels(plan.MoveLabels(bs.Name))); err != nil {
		return true, err
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			running = true
		}
	}
	return running, nil
}
