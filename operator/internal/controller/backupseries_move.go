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
//     status neither forgets the move nor starts a second one elsewhere;
//  2. backups wait (the CronJob is suspended, backup-now requests wait) and the running one
//     finishes;
//  3. a Job runs `revault move --keep-source`, which copies every version with its number and
//     checks that each restores from the destination byte for byte as from the source;
//  4. the operator checks both workers list the same versions, then moves the placement record
//     to the destination and notes the source's copy (revault.io/moved-from) in one write;
//  5. the source's copy is deleted, and the note removed.
//
// Until step 4 the source holds everything and serves the series; after it, the destination
// does. A failed copy leaves the series where it was, and is tried again later.
func (r *BackupSeriesReconciler) move(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs := s.bs
	if bs.Status.Worker == nil {
		return proceed()
	}
	if from := bs.Annotations[backupv1alpha1.MovedFromAnnotation]; from != "" {
		if err := r.dropMovedCopy(ctx, s, from); err != nil {
			return failed(err)
		}
	}
	if dest := bs.Annotations[backupv1alpha1.MovingAnnotation]; dest != "" {
		return r.continueMove(ctx, s, dest)
	}
	target, why, err := r.wantedMove(ctx, bs)
	if err != nil || target == "" {
		return proceed2(err)
	}
	return r.startMove(ctx, s, target, why)
}

func proceed2(err error) (ctrl.Result, bool, error) {
	if err != nil {
		return failed(err)
	}
	return proceed()
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
	rec := string(media) + "/" + dest
	if err := r.setAnnotations(ctx, bs, map[string]string{backupv1alpha1.MovingAnnotation: rec}); err != nil {
		return failed(err)
	}
	logf.FromContext(ctx).Info("moving series", "from", bs.Status.Worker.Node, "to", dest, "why", why)
	s.events.Eventf(bs, "Normal", "MoveStarted", "moving from node %s to node %s: %s", bs.Status.Worker.Node, dest, why)
	return r.continueMove(ctx, s, rec)
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
	media, node, _ := strings.Cut(dest, "/")
	s.moving = true
	w, found, err := r.Workers.OnNode(ctx, backupv1alpha1.Media(media), node)
	switch {
	case err != nil:
		return failed(err)
	case !found:
		// The destination went away before the switch: the source still holds everything.
		s.moving = false
		r.Recorder.Eventf(bs, "Warning", "MoveAbandoned", "no %s worker on node %s any more; the series stays on node %s",
			media, node, bs.Status.Worker.Node)
		return proceed2(r.abandonMove(ctx, bs, dest))
	case !w.Ready:
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForDestination",
			fmt.Sprintf("moving to node %s, whose worker pod %s is not ready", node, w.Pod))
		s.requeue = min(s.requeue, 15*time.Second)
		return proceed()
	}
	jobs, err := r.backupJobs(ctx, bs)
	if err != nil {
		return failed(err)
	}
	// Asked at every step up to the switch: a backup Job the cache did not show yet when the
	// CronJob was suspended, or an external producer's push, must not commit on the source
	// after the copy listed its versions.
	p := r.backupProgress(ctx, s)
	if active, _, _ := tallyJobs(jobs); active > 0 || (p != nil && p.Running) {
		s.cs.setTrue(backupv1alpha1.ConditionMoving, "WaitingForBackup",
			fmt.Sprintf("moving to node %s once the running backup ends; no scheduled backup starts meanwhile", node))
		s.requeue = min(s.requeue, 10*time.Second)
		return proceed()
	}
	return r.runMoveJob(ctx, s, dest, w)
}

// runMoveJob creates the copy Job, or acts on how it ended.
func (r *BackupSeriesReconciler) runMoveJob(ctx context.Context, s *seriesRun, dest string, to Worker) (ctrl.Result, bool, error) {
	bs := s.bs
	job := plan.MoveJob(r.Config, bs, bs.Status.Worker.Endpoint, to.Endpoint, dest)
	var cur batchv1.Job
	err := r.Get(ctx, client.ObjectKeyFromObject(job), &cur)
	switch {
	case apierrors.IsNotFound(err):
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
	return r.switchPlacement(ctx, s, dest, to, &cur)
}

// moveFailed lets backups run on the source again and retries the copy after moveRetryAfter
// (it continues from what the destination holds).
func (r *BackupSeriesReconciler) moveFailed(ctx context.Context, s *seriesRun, j *batchv1.Job, res jobResult) (ctrl.Result, bool, error) {
	out, _ := jobOutput(ctx, r.Client, r.PodOutput, j)
	if wait := res.at.Add(moveRetryAfter).Sub(r.Now()); wait > 0 {
		s.moving = false
		s.cs.setFalse(backupv1alpha1.ConditionMoving, "MoveFailed",
			fmt.Sprintf("Job %s failed: %s; the series stays on node %s and the move is tried again at %s",
				j.Name, res.failure(out), s.bs.Status.Worker.Node, res.at.Add(moveRetryAfter).UTC().Format(time.RFC3339)))
		s.requeue = min(s.requeue, wait+time.Second)
		return proceed()
	}
	s.requeue = min(s.requeue, 5*time.Second)
	return proceed2(client.IgnoreNotFound(r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))))
}

// switchPlacement checks that the destination lists every version the source does, then moves
// the placement record there (noting the source's copy for deletion) and the status with it.
func (r *BackupSeriesReconciler) switchPlacement(ctx context.Context, s *seriesRun, dest string, to Worker, j *batchv1.Job) (ctrl.Result, bool, error) {
	bs := s.bs
	from := bs.Status.Worker
	same, msg, err := r.sameVersions(ctx, bs, from, to)
	if err != nil {
		return failed(err)
	}
	if !same {
		// A backup reached the source after the copy (or a worker answered oddly): copy again.
		s.events.Eventf(bs, "Normal", "MoveRepeated", "copying again: %s", msg)
		s.requeue = min(s.requeue, 5*time.Second)
		return proceed2(client.IgnoreNotFound(r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))))
	}
	fromRec := string(from.Media) + "/" + from.Node
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
	s.cs.setFalse(backupv1alpha1.ConditionMoving, "Moved", fmt.Sprintf("moved from node %s to node %s: %s", from.Node, to.Node, msg))
	s.cs.setTrue(backupv1alpha1.ConditionPlaced, "Moved", fmt.Sprintf("%s worker on node %s (pod %s)", to.Media, to.Node, to.Pod))
	if err := client.IgnoreNotFound(r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))); err != nil {
		return failed(err)
	}
	// The status goes out now, so that nothing runs against the old worker after the switch.
	r.finishStatus(s, backupv1alpha1.SeriesReady)
	return stop(ctrl.Result{RequeueAfter: time.Second}, r.commitStatus(ctx, s))
}

// sameVersions compares the versions (numbers and sizes) the two workers list for the series.
func (r *BackupSeriesReconciler) sameVersions(ctx context.Context, bs *backupv1alpha1.BackupSeries, from *backupv1alpha1.WorkerPlacement,
	to Worker) (bool, string, error) {
	da, err := r.versionsOn(ctx, bs, from.Media, from.Node)
	if err != nil {
		return false, "", fmt.Errorf("listing the series on node %s: %w", from.Node, err)
	}
	db, err := r.versionsOn(ctx, bs, to.Media, to.Node)
	if err != nil {
		return false, "", fmt.Errorf("listing the series on node %s: %w", to.Node, err)
	}
	a, b := da.VersionList, db.VersionList
	if len(a) != len(b) {
		return false, fmt.Sprintf("node %s lists %d versions, node %s %d", from.Node, len(a), to.Node, len(b)), nil
	}
	var bytes int64
	for i := range a {
		if a[i].Number != b[i].Number || a[i].LogicalBytes != b[i].LogicalBytes {
			return false, fmt.Sprintf("version %d differs between node %s and node %s", a[i].Number, from.Node, to.Node), nil
		}
		bytes += a[i].LogicalBytes
	}
	return true, fmt.Sprintf("%d versions, %s", len(a), plan.HumanBytes(bytes)), nil
}

// abandonMove forgets a recorded move that cannot go on (its Job, if any, goes too).
func (r *BackupSeriesReconciler) abandonMove(ctx context.Context, bs *backupv1alpha1.BackupSeries, dest string) error {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: plan.MoveJobName(bs.Name, dest), Namespace: bs.Namespace}}
	if err := client.IgnoreNotFound(r.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground))); err != nil {
		return err
	}
	return r.setAnnotations(ctx, bs, map[string]string{backupv1alpha1.MovingAnnotation: ""})
}

// dropMovedCopy deletes the copy a finished move left on its source (from is MEDIA/NODE), then
// the note. It deletes only versions the series' worker now holds too, and only once that
// worker's bucket holds them when a remote is configured, so the source's copy goes last. A
// version only the source holds (pushed there after the switch by a producer that still had
// the old address) is never deleted: the note stays, and a warning says which versions.
func (r *BackupSeriesReconciler) dropMovedCopy(ctx context.Context, s *seriesRun, from string) error {
	bs := s.bs
	media, node, _ := strings.Cut(from, "/")
	at := bs.Status.Worker
	if backupv1alpha1.Media(media) == at.Media && node == at.Node {
		// Moved back to where it was: that copy is the series.
		return r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
	}
	keep := func(reason, format string, args ...any) error {
		s.events.Eventf(bs, map[bool]string{true: "Warning", false: "Normal"}[reason == "MovedCopyOnly"], reason,
			format, args...)
		s.requeue = min(s.requeue, time.Minute)
		return nil
	}
	here, err := r.versionsOn(ctx, bs, at.Media, at.Node)
	if err != nil {
		return keep("MovedCopyKept", "the copy left on node %s is kept for now: %v", node, err)
	}
	if r.Config.Remote != nil && (here.DurableVersion == nil || here.Latest == nil || *here.DurableVersion < *here.Latest) {
		return keep("MovedCopyKept", "the copy left on node %s is kept until node %s's bucket holds every version", node, at.Node)
	}
	there, err := r.versionsOn(ctx, bs, backupv1alpha1.Media(media), node)
	switch {
	case workerclient.IsNotFound(err):
		return r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
	case err != nil:
		return keep("MovedCopyKept", "the copy left on node %s is kept for now: %v", node, err)
	}
	held := map[int64]int64{}
	for _, v := range here.VersionList {
		held[v.Number] = v.LogicalBytes
	}
	var only []string
	for _, v := range there.VersionList {
		if b, ok := held[v.Number]; !ok || b != v.LogicalBytes {
			only = append(only, fmt.Sprint(v.Number))
		}
	}
	if len(only) > 0 {
		return keep("MovedCopyOnly", "node %s holds version(s) %s of the series that node %s does not (pushed after the move?): "+
			"that copy is kept; restore them from there and push them again, then remove the annotation %s",
			node, strings.Join(only, ", "), at.Node, backupv1alpha1.MovedFromAnnotation)
	}
	api, err := r.Workers.API(ctx, backupv1alpha1.Media(media), node)
	if err != nil {
		return err
	}
	for _, v := range there.VersionList {
		if _, err := api.DeleteVersion(ctx, bs.Namespace, bs.Name, v.Number); err != nil && !workerclient.IsNotFound(err) {
			return keep("MovedCopyKept", "the copy left on node %s is not deleted yet: %v", node, err)
		}
	}
	s.events.Eventf(bs, "Normal", "MovedCopyDeleted", "deleted the %d version(s) left on node %s", len(there.VersionList), node)
	return r.dropAnnotations(ctx, bs, backupv1alpha1.MovedFromAnnotation)
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
