package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// moveRetryAfter is how long a failed move waits (backups running again on the source) before
// it is tried again.
const moveRetryAfter = 5 * time.Minute

// A move, in the order that keeps one worker holding the whole series at every moment:
//
//  1. the destination is recorded (revault.io/moving-to) before anything is copied, so a lost
//     status neither forgets the move nor starts a second one elsewhere; the CronJob is
//     suspended in the same reconcile, and the copy starts in a later one;
//  2. backups wait (backup-now requests and the data mover too) and the running one finishes;
//  3. a Job runs `revault move --keep-source --prune-destination`, which copies every version
//     with its number and checks that each restores from the destination byte for byte as
//     from the source;
//  4. the operator checks both workers list the same versions, then in one write moves the
//     placement record to the destination and notes the source's copy with the newest version
//     checked (revault.io/moved-from: MEDIA/NODE@N); the status follows;
//  5. the source's versions up to N are deleted, and the note removed. A version above N on
//     the source (written there after the switch) is never deleted.
//
// Until step 4 the source holds everything and serves the series; after it, the destination
// does. A failed copy leaves the series where it was, and is tried again later.
func (r *BackupSeriesReconciler) move(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	if bs.Status.Worker == nil {
		return proceed()
	}
	if err := r.rollForward(ctx, s); err != nil {
		return failed(err)
	}
	if from := bs.Annotations[backupv1alpha1.MovedFromAnnotation]; from != "" {
		done, err := r.dropMovedCopy(ctx, s, from)
		if err != nil || !done {
			// No new move while the last one's old copy is noted: its note would be lost.
			return proceedUnless(err)
		}
	}
	target, why, err := r.wantedMove(ctx, bs)
	if err != nil {
		return failed(err)
	}
	if dest := bs.Annotations[backupv1alpha1.MovingAnnotation]; dest != "" {
		if isHome(bs, dest) {
			// The move is over (a BackupSeries restored from before its switch, or a stale
			// read): the destination is the series' home, never a copy to cancel.
			return proceedUnless(r.dropAnnotations(ctx, bs, backupv1alpha1.MovingAnnotation))
		}
		if target == "" {
			return r.cancelMove(ctx, s, dest)
		}
		return r.continueMove(ctx, s, dest)
	}
	if err := r.dropFinishedMoveJobs(ctx, bs); err != nil {
		return failed(err)
	}
	if target == "" {
		return proceed()
	}
	return r.startMove(ctx, s, target, why)
}

// isHome says whether rec (MEDIA/NODE) names the series' worker or its placement record.
func isHome(bs *backupv1alpha1.BackupSeries, rec string) bool {
	return rec == plan.StoreOf(bs.Status.Worker).String() || rec == bs.Annotations[backupv1alpha1.PlacementAnnotation]
}

// backupsHeld says why no backup may start for the series now ("" when one may): a move copies
// it (revault.io/moving-to), or a move's switch has not reached the status yet (the placement
// record names another worker than the status does). Jobs that write to the series, the data
// mover's too, wait while it says so.
func backupsHeld(bs *backupv1alpha1.BackupSeries) string {
	if dest := bs.Annotations[backupv1alpha1.MovingAnnotation]; dest != "" {
		return "it is being moved to " + dest
	}
	rec := bs.Annotations[backupv1alpha1.PlacementAnnotation]
	if at := bs.Status.Worker; at != nil && rec != "" && rec != plan.StoreOf(at).String() {
		return "it is switching to " + rec
	}
	return ""
}

// rollForward finishes a switch whose annotations were written but whose status was not (a
// failed status write, a restart): the placement record names the destination and the note
// names the worker the status still does.
func (r *BackupSeriesReconciler) rollForward(ctx context.Context, s *seriesRun) error {
	bs, here := s.bs, plan.StoreOf(s.bs.Status.Worker)
	from, fok := plan.StoreOfRecord(bs.Annotations[backupv1alpha1.MovedFromAnnotation])
	to, tok := plan.ParseStoreRef(bs.Annotations[backupv1alpha1.PlacementAnnotation])
	if !fok || !tok || from != here || to == here {
		return nil
	}
	w, found, err := r.Workers.OnNode(ctx, to.Media, to.Node)
	if err != nil {
		return err
	}
	p := &backupv1alpha1.WorkerPlacement{Media: to.Media, Node: to.Node, Endpoint: r.Workers.endpoint(to.Media, to.Node)}
	if found {
		p = r.Workers.Placement(w)
	}
	bs.Status.Worker = p
	s.events.Eventf(bs, "Normal", "Moved", "the series is on node %s (its move's switch is finished now)", to.Node)
	return nil
}

// wantedMove is where the series is asked to go ("any": the worker with the most room) and why;
// "" when it stays.
func (r *BackupSeriesReconciler) wantedMove(ctx context.Context, bs *backupv1alpha1.BackupSeries) (target, why string, _ error) {
	if t := strings.TrimSpace(bs.Annotations[backupv1alpha1.MoveToAnnotation]); t != "" {
		if t == bs.Status.Worker.Node {
			return "", "", r.dropAnnotations(ctx, bs, backupv1alpha1.MoveToAnnotation)
		}
		return t, "asked by annotation " + backupv1alpha1.MoveToAnnotation, nil
	}
	draining, err := r.draining(ctx, bs.Status.Worker.Node)
	if err != nil || !draining {
		return "", "", err
	}
	return "any", fmt.Sprintf("node %s is drained (annotation %s)", bs.Status.Worker.Node, backupv1alpha1.DrainAnnotation), nil
}

// draining says whether the node carries revault.io/drain=true.
func (r *BackupSeriesReconciler) draining(ctx context.Context, node string) (bool, error) {
	var n corev1.Node
	if err := r.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return n.Annotations[backupv1alpha1.DrainAnnotation] == "true", nil
}

// startMove chooses the destination and records it; the copy starts in continueMove.
func (r *BackupSeriesReconciler) startMove(ctx context.Context, s *seriesRun, target, why string) (ctrl.Result, bool, error) {
	bs := s.bs
	media := bs.Status.Worker.Media
	dest, reason, msg, err := r.moveDestination(ctx, bs, media, target)
	if err != nil {
		return failed(err)
	}
	if dest == "" {
		s.cs.setFalse(backupv1alpha1.ConditionMoving, reason, fmt.Sprintf("cannot move (%s): %s", why, msg))
		s.requeue = min(s.requeue, time.Minute)
		return proceed()
	}
	rec := plan.StoreRef{Media: media, Node: dest}.String()
	if err := r.setAnnotations(ctx, bs, map[string]string{backupv1alpha1.MovingAnnotation: rec}); err != nil {
		return failed(err)
	}
	logf.FromContext(ctx).Info("moving series", "from", bs.Status.Worker.Node, "to", dest, "why", why)
	s.events.Eventf(bs, "Normal", "MoveStarted", "moving from node %s to node %s: %s", bs.Status.Worker.Node, dest, why)
	// The CronJob is suspended by this reconcile (s.moving); the copy starts in the next.
	s.moving = true
	s.cs.setTrue(backupv1alpha1.ConditionMoving, "Starting", fmt.Sprintf("moving to node %s: %s", dest, why))
	s.requeue = min(s.requeue, 2*time.Second)
	return proceed()
}

// moveDestination is the node whose worker of media takes the series: the one target names, or
// with "any" the reachable one with the most room. Never the series' own, an adopted store or a
// drained node. "" with a reason and message when none can.
func (r *BackupSeriesReconciler) moveDestination(ctx context.Context, bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media,
	target string) (node, reason, msg string, _ error) {
	ws, err := r.Workers.List(ctx, media)
	if err != nil {
		return "", "", "", err
	}
	var cands []plan.Candidate
	var problems []string
	for _, w := range ws {
		if w.Node == bs.Status.Worker.Node || (target != "any" && w.Node != target) {
			continue
		}
		c, why, err := r.moveCandidate(ctx, bs, media, w)
		if err != nil {
			return "", "", "", err
		}
		if why != "" {
			problems = append(problems, w.Node+": "+why)
			continue
		}
		cands = append(cands, c)
	}
	if c, ok := plan.ChooseWorker(cands); ok {
		return c.Node, "", "", nil
	}
	if target != "any" && len(problems) == 0 {
		return "", "NoDestination", fmt.Sprintf("no %s worker on node %s", media, target), nil
	}
	if len(problems) == 0 {
		return "", "NoDestination", fmt.Sprintf("no other %s worker", media), nil
	}
	return "", "NoDestination", joinMax(problems, 4), nil
}

// moveCandidate says what worker w offers a series moving in, or why it cannot take it.
func (r *BackupSeriesReconciler) moveCandidate(ctx context.Context, bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media,
	w Worker) (plan.Candidate, string, error) {
	if !w.Ready {
		return plan.Candidate{}, "pod " + w.Pod + " not ready", nil
	}
	if w.Host != w.Node {
		return plan.Candidate{}, "an adopted store (of a lost node) takes no series", nil
	}
	if d, err := r.draining(ctx, w.Node); err != nil || d {
		return plan.Candidate{}, "drained", err
	}
	api, err := r.Workers.API(ctx, media, w.Node)
	if err != nil {
		return plan.Candidate{}, "", err
	}
	// A worker that kept the series' record (it was moved away from there, or deleted) would
	// refuse its old version numbers: it never gives a number twice.
	switch _, err := api.Series(ctx, bs.Namespace, bs.Name); {
	case err == nil:
		return plan.Candidate{}, "holds an earlier record of the series, and never takes a version number twice", nil
	case !workerclient.IsNotFound(err):
		return plan.Candidate{}, err.Error(), nil
	}
	st, err := api.Stats(ctx)
	if err != nil {
		return plan.Candidate{}, err.Error(), nil
	}
	c := plan.Candidate{Node: w.Node, Pod: w.Pod, Reachable: true, StoredBytes: st.ContainerBytes, Room: r.reportedRoom(st)}
	if why := c.NearlyFull(); why != "" {
		return plan.Candidate{}, why, nil
	}
	return c, "", nil
}

// continueMove drives a recorded move (dest is MEDIA/NODE) one step: wait for the running
// backup, run the copy Job, and switch the placement once it succeeded.
func (r *BackupSeriesReconciler) continueMove(ctx context.Context, s *seriesRun, dest string) (ctrl.Result, bool, error) {
	bs := s.bs
	s.moving = true
	ref, ok := plan.ParseStoreRef(dest)
	if !ok {
		// Not one the operator wrote: nothing was copied to a store it cannot name.
		s.events.Eventf(bs, "Warning", "MoveAbandoned", "annotation %s=%q is not MEDIA/NODE", backupv1alpha1.MovingAnnotation, dest)
		s.moving = false
		return proceedUnless(r.dropAnnotations(ctx, bs, backupv1alpha1.MovingAnnotation))
	}
	media, node := ref.Media, ref.Node
	w, found, err := r.Workers.OnNode(ctx, media, node)
	switch {
	case err != nil:
		return failed(err)
	case !found:
		gone, err := r.storeGone(ctx, node)
		if err != nil || !gone {
			s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForDestination",
				fmt.Sprintf("moving to node %s, which has no %s worker pod right now", node, media))
			s.requeue = min(s.requeue, 15*time.Second)
			return proceedUnless(err)
		}
		// The destination's node is gone (or no longer a storage node) before the switch: the
		// source still holds everything.
		s.events.Eventf(bs, "Warning", "MoveAbandoned", "node %s is no longer a storage node; the series stays on node %s",
			node, bs.Status.Worker.Node)
		return r.cancelMove(ctx, s, dest)
	case !w.Ready:
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForDestination",
			fmt.Sprintf("moving to node %s, whose worker pod %s is not ready", node, w.Pod))
		s.requeue = min(s.requeue, 15*time.Second)
		return proceed()
	}
	if ok, err := r.Workers.TokenAccepted(ctx, w.Media, w.Node, bs.Namespace); err != nil || !ok {
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForToken",
			fmt.Sprintf("moving to node %s once its worker accepts the namespace's token", node))
		s.requeue = min(s.requeue, 10*time.Second)
		return proceed()
	}
	return r.runMoveJob(ctx, s, dest, w)
}

// seal seals the series on its worker as moved to *to, or unseals it (nil).
func (r *BackupSeriesReconciler) seal(ctx context.Context, s *seriesRun, to *string) error {
	at := s.bs.Status.Worker
	api, err := r.Workers.API(ctx, at.Media, at.Node)
	if err != nil {
		return err
	}
	return api.SetMovedTo(ctx, s.bs.Namespace, s.bs.Name, to)
}

// annotationSourceChanged, on a succeeded move Job, is when the operator found the source's
// versions changed since the copy: the copy is made again moveRetryAfter later.
const annotationSourceChanged = "revault.io/source-changed"

// sourceChangedAt reads annotationSourceChanged.
func sourceChangedAt(j *batchv1.Job) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, j.Annotations[annotationSourceChanged])
	return t, err == nil
}

// backupRunning says whether a backup of the series runs: a backup Job (one the cache did not
// show yet when the CronJob was suspended comes up here later), or a push the worker reports
// (an external producer). Asked before the copy starts and again before the switch, so that no
// backup commits on the source after the copy listed its versions.
func (r *BackupSeriesReconciler) backupRunning(ctx context.Context, s *seriesRun, node string) (bool, error) {
	jobs, err := r.backupJobs(ctx, s.bs)
	if err != nil {
		return false, err
	}
	p := r.backupProgress(ctx, s)
	if active, _, _ := tallyJobs(jobs); active == 0 && (p == nil || !p.Running) {
		return false, nil
	}
	s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForBackup",
		fmt.Sprintf("moving to node %s once the running backup ends; no scheduled backup starts meanwhile", node))
	s.requeue = min(s.requeue, 10*time.Second)
	return true, nil
}

// runMoveJob creates the copy Job, or acts on how it ended.
func (r *BackupSeriesReconciler) runMoveJob(ctx context.Context, s *seriesRun, dest string, to Worker) (ctrl.Result, bool, error) {
	bs := s.bs
	job := plan.MoveJob(r.Config, bs, bs.Status.Worker.Endpoint, to.Endpoint, dest)
	var cur batchv1.Job
	err := r.Get(ctx, client.ObjectKeyFromObject(job), &cur)
	switch {
	case apierrors.IsNotFound(err):
		if busy, err := r.backupRunning(ctx, s, to.Node); err != nil || busy {
			return proceedUnless(err)
		}
		if err := controllerutil.SetControllerReference(bs, job, r.Scheme); err != nil {
			return failed(err)
		}
		if err := r.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return failed(err)
		}
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "Copying",
			fmt.Sprintf("copying every version to node %s (Job %s)", to.Node, job.Name))
		s.requeue = min(s.requeue, 15*time.Second)
		return proceed()
	case err != nil:
		return failed(err)
	case cur.DeletionTimestamp != nil:
		s.requeue = min(s.requeue, 5*time.Second)
		return proceed()
	}
	res := jobFinished(&cur)
	switch {
	case !res.done:
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "Copying",
			fmt.Sprintf("copying every version to node %s (Job %s)", to.Node, cur.Name))
		s.requeue = min(s.requeue, 15*time.Second)
		return proceed()
	case !res.succeeded:
		return r.moveFailed(ctx, s, &cur, res)
	}
	if at, ok := sourceChangedAt(&cur); ok {
		// The last comparison found the source changed: backups run there for a while, then
		// the Job goes and the copy is made again.
		return r.retryLater(ctx, s, &cur, jobResult{done: true, at: at}, "SourceChanged",
			"the source changed during the copy")
	}
	if busy, err := r.backupRunning(ctx, s, to.Node); err != nil || busy {
		return proceedUnless(err)
	}
	// Sealed before the last comparison: from here on the old worker refuses every backup of
	// the series (naming the new one), so none is acknowledged there after the versions were
	// compared. A backup still running there makes the seal wait (409 series_busy).
	if err := r.seal(ctx, s, &to.Endpoint); workerclient.IsConflict(err) {
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForBackup",
			fmt.Sprintf("switching to node %s once the backup running on node %s ends", to.Node, s.bs.Status.Worker.Node))
		s.requeue = min(s.requeue, 10*time.Second)
		return proceed()
	} else if workerclient.HasCode(err, workerclient.ErrorCodeUnavailable) {
		// A store degraded by a full disk serves the copy but takes no seal (a write): the
		// switch waits for room there, saying so, with the CronJob still held.
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForSource",
			fmt.Sprintf("switching to node %s once the worker on node %s takes writes again: %v", to.Node, s.bs.Status.Worker.Node, err))
		s.requeue = min(s.requeue, time.Minute)
		return proceed()
	} else if err != nil {
		return failed(err)
	}
	return r.switchPlacement(ctx, s, dest, to, &cur)
}

// moveFailed lets backups run on the source again and retries the copy after moveRetryAfter
// (it continues from what the destination holds).
func (r *BackupSeriesReconciler) moveFailed(ctx context.Context, s *seriesRun, j *batchv1.Job, res jobResult) (ctrl.Result, bool, error) {
	out, _ := jobOutput(ctx, r.Client, r.PodOutput, j)
	return r.retryLater(ctx, s, j, res, "MoveFailed", fmt.Sprintf("Job %s failed: %s", j.Name, res.failure(out)))
}

// retryLater keeps a finished move Job until moveRetryAfter has passed (backups run on the
// source meanwhile), then deletes it so the next reconcile copies again.
func (r *BackupSeriesReconciler) retryLater(ctx context.Context, s *seriesRun, j *batchv1.Job, res jobResult, reason, why string) (ctrl.Result, bool, error) {
	if wait := res.at.Add(moveRetryAfter).Sub(r.Now()); wait > 0 {
		s.moving = false
		s.cs.setFalse(backupv1alpha1.ConditionMoving, reason,
			fmt.Sprintf("%s; the series stays on node %s and the move is tried again at %s",
				why, s.bs.Status.Worker.Node, res.at.Add(moveRetryAfter).UTC().Format(time.RFC3339)))
		s.requeue = min(s.requeue, wait+time.Second)
		return proceed()
	}
	s.requeue = min(s.requeue, 5*time.Second)
	return proceedUnless(client.IgnoreNotFound(r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))))
}

// switchPlacement checks that the destination lists every version the source does, then moves
// the placement record there (noting the source's copy, and the newest version checked, for
// deletion) and the status with it. The Job is deleted by a later reconcile, after the status.
func (r *BackupSeriesReconciler) switchPlacement(ctx context.Context, s *seriesRun, dest string, to Worker, j *batchv1.Job) (ctrl.Result, bool, error) {
	bs := s.bs
	from := bs.Status.Worker
	same, through, msg, err := r.sameVersions(ctx, bs, from, to)
	if err != nil {
		return failed(err)
	}
	if !same {
		// A version reached the source after the copy listed its versions (an external
		// producer), or one expired there: unsealed, backups run there again, and the copy is
		// made again after a pause.
		if err := r.seal(ctx, s, nil); err != nil {
			return failed(err)
		}
		// The pause is recorded on the Job (a stale read of the series cannot lose it).
		patch := client.MergeFrom(j.DeepCopy())
		if j.Annotations == nil {
			j.Annotations = map[string]string{}
		}
		now := r.Now().UTC()
		j.Annotations[annotationSourceChanged] = now.Format(time.RFC3339)
		if err := r.Patch(ctx, j, patch); err != nil {
			return failed(err)
		}
		return r.retryLater(ctx, s, j, jobResult{done: true, at: now}, "SourceChanged",
			"the source changed during the copy ("+msg+")")
	}
	fromRec := plan.MovedFrom(plan.StoreOf(from), through)
	err = r.setAnnotations(ctx, bs, map[string]string{
		backupv1alpha1.PlacementAnnotation: dest,
		backupv1alpha1.MovedFromAnnotation: fromRec,
		backupv1alpha1.MovingAnnotation:    "",
		backupv1alpha1.MoveToAnnotation:    "",
	})
	if err != nil {
		return failed(err)
	}
	bs.Status.Worker = r.Workers.Placement(to)
	s.moving = false
	s.cs.waiting(backupv1alpha1.ConditionMoving, "Moved", fmt.Sprintf("moved from node %s to node %s: %s", from.Node, to.Node, msg))
	s.cs.setTrue(backupv1alpha1.ConditionPlaced, "Moved", fmt.Sprintf("%s worker on node %s (pod %s)", to.Media, to.Node, to.Pod))
	// The status goes out now, so that nothing runs against the old worker after the switch.
	r.finishStatus(s, backupv1alpha1.SeriesReady)
	return stop(ctrl.Result{RequeueAfter: time.Second}, r.commitStatus(ctx, s))
}

// sameVersions compares the versions (numbers and sizes) the two workers list for the series.
func (r *BackupSeriesReconciler) sameVersions(ctx context.Context, bs *backupv1alpha1.BackupSeries, from *backupv1alpha1.WorkerPlacement,
	to Worker) (same bool, through int64, msg string, _ error) {
	da, err := r.versionsOn(ctx, bs, from.Media, from.Node)
	if err != nil {
		return false, 0, "", fmt.Errorf("listing the series on node %s: %w", from.Node, err)
	}
	db, err := r.versionsOn(ctx, bs, to.Media, to.Node)
	if err != nil {
		return false, 0, "", fmt.Errorf("listing the series on node %s: %w", to.Node, err)
	}
	a, b := da.VersionList, db.VersionList
	if len(a) != len(b) {
		return false, 0, fmt.Sprintf("node %s lists %d versions, node %s %d", from.Node, len(a), to.Node, len(b)), nil
	}
	var bytes int64
	for i := range a {
		if a[i].Number != b[i].Number || a[i].LogicalBytes != b[i].LogicalBytes {
			return false, 0, fmt.Sprintf("version %d differs between node %s and node %s", a[i].Number, from.Node, to.Node), nil
		}
		bytes += a[i].LogicalBytes
		through = a[i].Number
	}
	return true, through, fmt.Sprintf("%d versions, %s", len(a), plan.HumanBytes(bytes)), nil
}

// cancelMove ends a move before its switch (no longer asked for, or its destination's node gone):
// the copy Job goes first, and its pods (so no upload is still on its way), then the source's
// seal, then the partial copy on the destination, then the record. The source holds
// everything throughout.
func (r *BackupSeriesReconciler) cancelMove(ctx context.Context, s *seriesRun, dest string) (ctrl.Result, bool, error) {
	bs := s.bs
	s.moving = true
	if running, err := r.stopMoves(ctx, bs); err != nil || running {
		s.requeue = min(s.requeue, 5*time.Second)
		return proceedUnless(err)
	}
	ref, _ := plan.ParseStoreRef(dest)
	// Read again, uncached: the partial copy is deleted only if the record still says it is one.
	if fresh, err := r.freshSeries(ctx, bs); err != nil {
		return failed(err)
	} else if fresh.Annotations[backupv1alpha1.MovingAnnotation] != dest || isHome(fresh, dest) {
		s.requeue = min(s.requeue, time.Second)
		return proceed()
	}
	// A crash between the seal and the switch left the source sealed: it takes backups again.
	if err := r.seal(ctx, s, nil); err != nil && !workerclient.IsNotFound(err) {
		return failed(err)
	}
	api, err := r.Workers.API(ctx, ref.Media, ref.Node)
	if err == nil {
		_, err = api.DeleteSeries(ctx, bs.Namespace, bs.Name)
	}
	if err != nil && !workerclient.IsNotFound(err) {
		s.events.Eventf(bs, "Warning", "MoveCancelled", "the partial copy on node %s is not deleted: %v", ref.Node, err)
	}
	if err := r.setAnnotations(ctx, bs, map[string]string{backupv1alpha1.MovingAnnotation: ""}); err != nil {
		return failed(err)
	}
	s.moving = false
	s.cs.waiting(backupv1alpha1.ConditionMoving, "Cancelled",
		fmt.Sprintf("the move to node %s ended before its switch; the series stays on node %s", ref.Node, bs.Status.Worker.Node))
	return proceed()
}

// apiReader reads uncached when the manager gave one (the cached client otherwise).
func (r *BackupSeriesReconciler) apiReader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

// freshSeries reads the series through the API reader (the cached client without one).
func (r *BackupSeriesReconciler) freshSeries(ctx context.Context, bs *backupv1alpha1.BackupSeries) (*backupv1alpha1.BackupSeries, error) {
	fresh := &backupv1alpha1.BackupSeries{}
	if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(bs), fresh); err != nil {
		return nil, err
	}
	if fresh.Status.Worker == nil {
		fresh.Status.Worker = bs.Status.Worker
	}
	return fresh, nil
}

// dropFinishedMoveJobs deletes the move Jobs left once no move is under way.
func (r *BackupSeriesReconciler) dropFinishedMoveJobs(ctx context.Context, bs *backupv1alpha1.BackupSeries) error {
	jobs, err := r.moveJobs(ctx, bs)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if j.DeletionTimestamp == nil && jobFinished(j).done {
			if err := r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

// storeGone: node is no longer a storage node (deleted, or its label removed), so its store
// will not serve again under that node's name.
func (r *BackupSeriesReconciler) storeGone(ctx context.Context, node string) (bool, error) {
	if node == "" {
		return true, nil
	}
	// Uncached: the cache holds storage-labelled Nodes only, and a stale answer here forgets a
	// copy or skips a deletion.
	var n corev1.Node
	err := r.apiReader().Get(ctx, client.ObjectKey{Name: node}, &n)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	_, labelled := n.Labels[backupv1alpha1.StorageLabel]
	return !labelled, nil
}

// dropMovedCopy deletes the copy a finished move left on its source (from is MEDIA/NODE@N: N
// the newest version both workers listed at the switch), then the note; true once the note is
// gone. It waits, with a remote, until the series' worker's bucket holds every version, so the
// old copy goes last. It deletes the old worker's versions up to N only: a version above N was
// written there after the switch (by a producer with the old address), is never deleted, and
// keeps the note, with a warning naming it. So does a source without a worker pod: only a person
// can tell that its node is gone for good.
func (r *BackupSeriesReconciler) dropMovedCopy(ctx context.Context, s *seriesRun, from string) (bool, error) {
	bs, at := s.bs, s.bs.Status.Worker
	old, through, parsed := plan.ParseMovedFrom(from)
	if parsed && old == plan.StoreOf(at) {
		// A note naming the series' own worker (written by hand?): that copy is the series.
		return true, r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
	}
	media, node := old.Media, old.Node
	// The Moving condition (not only an event, which a recorder may drop) says why the old
	// copy is still there.
	keep := func(reason, format string, args ...any) (bool, error) {
		msg := fmt.Sprintf(format, args...)
		if reason == "MovedCopyOnly" {
			s.cs.setFalse(backupv1alpha1.ConditionMoving, reason, msg)
		} else {
			s.cs.waiting(backupv1alpha1.ConditionMoving, reason, msg)
		}
		s.requeue = min(s.requeue, time.Minute)
		return false, nil
	}
	if !parsed {
		return keep("MovedCopyOnly", "the annotation %s=%q is not MEDIA/NODE@VERSION: nothing is deleted from that worker; "+
			"check what it holds, then remove the annotation", backupv1alpha1.MovedFromAnnotation, from)
	}
	if _, found, err := r.Workers.OnNode(ctx, media, node); err != nil {
		return false, err
	} else if !found {
		// Never forgotten on its own: versions written there after the move would go unseen.
		return keep("MovedCopyKept", "the copy left on node %s is kept until its worker is back (if node %s is gone for good, "+
			"so is that copy: remove the annotation %s)", node, node, backupv1alpha1.MovedFromAnnotation)
	}
	here, err := r.versionsOn(ctx, bs, at.Media, at.Node)
	if err != nil {
		return keep("MovedCopyKept", "the copy left on node %s is kept for now: %v", node, err)
	}
	if r.Config.Remote != nil && (here.DurableVersion == nil || here.Latest == nil || *here.DurableVersion < *here.Latest) {
		return keep("MovedCopyKept", "the copy left on node %s is kept until node %s's bucket holds every version", node, at.Node)
	}
	there, err := r.versionsOn(ctx, bs, media, node)
	switch {
	case workerclient.IsNotFound(err):
		return true, r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
	case err != nil:
		return keep("MovedCopyKept", "the copy left on node %s is kept for now: %v", node, err)
	}
	api, err := r.Workers.API(ctx, media, node)
	if err != nil {
		return false, err
	}
	del, only, missing := oldCopyFate(there.VersionList, here.VersionList, through)
	for _, v := range del {
		if _, err := api.DeleteVersion(ctx, bs.Namespace, bs.Name, v); err != nil && !workerclient.IsNotFound(err) {
			return keep("MovedCopyKept", "the copy left on node %s is not deleted yet: %v", node, err)
		}
	}
	deleted := len(del)
	if len(missing) > 0 {
		return keep("MovedCopyKept", "node %s does not hold version(s) %s that node %s kept: that copy is kept",
			at.Node, strings.Join(missing, ", "), node)
	}
	if len(only) > 0 {
		return keep("MovedCopyOnly", "node %s holds version(s) %s of the series, written there after the move (by a producer "+
			"with the old address?): they are kept; restore them from there and push them again, then remove the annotation %s",
			node, strings.Join(only, ", "), backupv1alpha1.MovedFromAnnotation)
	}
	s.cs.waiting(backupv1alpha1.ConditionMoving, "MovedCopyDeleted",
		fmt.Sprintf("on node %s since the move; the %d version(s) it left on node %s are deleted", at.Node, deleted, node))
	return true, r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
}

// versionsOn is the series as node's worker of media lists it.
func (r *BackupSeriesReconciler) versionsOn(ctx context.Context, bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media,
	node string) (*workerclient.SeriesDetail, error) {
	api, err := r.Workers.API(ctx, media, node)
	if err != nil {
		return nil, err
	}
	return api.Series(ctx, bs.Namespace, bs.Name)
}

func (r *BackupSeriesReconciler) dropAnnotations(ctx context.Context, bs *backupv1alpha1.BackupSeries, keys ...string) error {
	m := map[string]string{}
	for _, k := range keys {
		m[k] = ""
	}
	return r.setAnnotations(ctx, bs, m)
}

// setAnnotations sets (or with "" removes) annotations in one metadata patch under the
// resourceVersion read, and takes the answer's annotations and resourceVersion back.
func (r *BackupSeriesReconciler) setAnnotations(ctx context.Context, bs *backupv1alpha1.BackupSeries, kv map[string]string) error {
	cp := bs.DeepCopy()
	patch := client.MergeFromWithOptions(bs.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	changed := false
	for k, v := range kv {
		old, had := cp.Annotations[k]
		switch {
		case v == "" && had:
			delete(cp.Annotations, k)
			changed = true
		case v != "" && old != v:
			cp.Annotations[k] = v
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Patch(ctx, cp, patch); err != nil {
		return err
	}
	bs.Annotations, bs.ResourceVersion = cp.Annotations, cp.ResourceVersion
	return nil
}

// oldCopyFate sorts the versions a move left on the old worker (old) by what becomes of them,
// given what the series' worker lists now (cur) and the newest version both listed at the
// switch (through): del are deleted; only were written to the old worker after the switch and
// are kept; missing are up to through but the series' worker neither holds them (with the same
// size) nor has expired them (older than its oldest version, itself from before the switch), so
// they are kept too.
func oldCopyFate(old, cur []workerclient.Version, through int64) (del []int64, only, missing []string) {
	held := map[int64]int64{}
	oldest := int64(-1)
	for _, v := range cur {
		held[v.Number] = v.LogicalBytes
		if oldest < 0 || v.Number < oldest {
			oldest = v.Number
		}
	}
	for _, v := range old {
		b, ok := held[v.Number]
		switch {
		case v.Number > through:
			only = append(only, fmt.Sprint(v.Number))
		case ok && b == v.LogicalBytes, !ok && oldest >= 0 && oldest <= through && v.Number < oldest:
			del = append(del, v.Number)
		default:
			missing = append(missing, fmt.Sprint(v.Number))
		}
	}
	return del, only, missing
}
