package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// placement chooses a worker for a series that has none. Once chosen, a series stays on its
// worker (the worker holds its data), and Placed says whether that worker is there and ready.
func (r *BackupSeriesReconciler) placement(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	if s.bs.Status.Worker == nil {
		return r.placeNew(ctx, s)
	}
	return r.followWorker(ctx, s)
}

// placeNew places the series and ends the reconcile: it waits for a worker when none can take
// the series, and otherwise writes the placement before anything uses it.
func (r *BackupSeriesReconciler) placeNew(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	bs, st := s.bs, &s.bs.Status
	p, reason, msg, err := r.place(ctx, bs)
	if err != nil {
		return failed(err)
	}
	if p == nil {
		s.o.waiting = true
		s.cs.setFalse(backupv1alpha1.ConditionPlaced, reason, msg)
		r.finishStatus(s, backupv1alpha1.SeriesPending)
		return stop(ctrl.Result{RequeueAfter: 15 * time.Second}, r.commitStatus(ctx, s))
	}
	// The record that survives a lost status goes first: if the status write then fails, the
	// next reconcile follows the record to the same worker.
	if err := r.recordPlacement(ctx, bs, p); err != nil {
		return failed(err)
	}
	st.Worker = p
	logf.FromContext(ctx).Info("placed series", "node", p.Node, "media", p.Media)
	s.cs.setTrue(backupv1alpha1.ConditionPlaced, reason, msg)
	// Record the placement before anything (a Job, a CronJob) uses it: if this write
	// fails, nothing points at the chosen worker yet and the next reconcile chooses again.
	st.ObservedGeneration = bs.Generation
	return stop(ctrl.Result{RequeueAfter: time.Second}, r.commitStatus(ctx, s))
}

// followWorker sets Placed from the worker pod on the series' node, and records its name.
func (r *BackupSeriesReconciler) followWorker(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	st := &s.bs.Status
	w, ok, err := r.Workers.OnNode(ctx, st.Worker.Media, st.Worker.Node)
	if err != nil {
		return failed(err)
	}
	if ok {
		// The same Service; its scheme follows TLS being turned on or off.
		st.Worker.Endpoint = w.Endpoint
	}
	switch {
	case !ok:
		s.cs.setFalse(backupv1alpha1.ConditionPlaced, "WorkerMissing",
			fmt.Sprintf("no %s worker pod on node %s: the series' data is there; backups wait for it", st.Worker.Media, st.Worker.Node))
	case !w.Ready:
		st.Worker.Pod, st.Worker.Host = w.Pod, w.Host
		s.cs.setFalse(backupv1alpha1.ConditionPlaced, "WorkerNotReady",
			fmt.Sprintf("worker pod %s of node %s's store is not ready", w.Pod, w.Node))
	case w.Host != w.Node:
		st.Worker.Pod, st.Worker.Host = w.Pod, w.Host
		s.cs.setTrue(backupv1alpha1.ConditionPlaced, "StoreAdopted",
			fmt.Sprintf("the %s store of lost node %s, rebuilt from the remote, served from node %s (pod %s)", w.Media, w.Node, w.Host, w.Pod))
	default:
		st.Worker.Pod, st.Worker.Host = w.Pod, w.Host
		s.cs.setTrue(backupv1alpha1.ConditionPlaced, "WorkerSelected",
			fmt.Sprintf("%s worker on node %s (pod %s)", w.Media, w.Node, w.Pod))
	}
	return proceed()
}

// place chooses a worker for a series: the worker that already holds it (status is lost when a
// BackupSeries is recreated, e.g. restored from a cluster backup), else the reachable worker of
// its media with the most free room that is not nearly full (plan.ChooseWorker).
func (r *BackupSeriesReconciler) place(ctx context.Context, bs *backupv1alpha1.BackupSeries) (
	_ *backupv1alpha1.WorkerPlacement, reason, msg string, _ error) {
	media := bs.Spec.Storage.Media
	if media == "" {
		media = backupv1alpha1.MediaSSD
	}
	if _, ok := r.Config.Pool(media); !ok {
		return nil, "NoWorker", fmt.Sprintf("the operator runs no %s worker pool", media), nil
	}
	if node, ok := recordedNode(bs, media); ok {
		p, reason, msg, err := r.followRecord(ctx, bs, media, node)
		if p != nil || reason != "" || err != nil {
			return p, reason, msg, err
		}
	}
	ws, err := r.Workers.List(ctx, media)
	if err != nil {
		return nil, "", "", err
	}
	placed, err := r.seriesPerNode(ctx, media)
	if err != nil {
		return nil, "", "", err
	}
	adopted, cands, problems, err := r.candidates(ctx, bs, media, ws, placed)
	switch {
	case err != nil:
		return nil, "", "", err
	case adopted != nil:
		return r.Workers.Placement(*adopted), "Adopted", fmt.Sprintf("the %s worker on node %s already holds series %s",
			media, adopted.Node, plan.SeriesID(bs.Namespace, bs.Name)), nil
	}
	// A worker that is ready but did not say whether it holds the series may be the one that
	// does: placing the series elsewhere now could start a second history.
	for _, c := range cands {
		if !c.Reachable {
			return nil, "WorkerUnreachable", fmt.Sprintf("cannot tell whether the %s worker on node %s holds series %s (%s): "+
				"waiting for its answer", media, c.Node, plan.SeriesID(bs.Namespace, bs.Name), joinMax(problems, 4)), nil
		}
	}
	c, ok := plan.ChooseWorker(cands)
	if !ok {
		return nil, noWorkerReason(cands), noWorkerMessage(media, cands, problems), nil
	}
	for _, w := range ws {
		if w.Node == c.Node {
			return r.Workers.Placement(w), "WorkerSelected", fmt.Sprintf("%s worker with the most room: node %s (%s, %d stored bytes, %d series)",
				media, c.Node, roomOf(c), c.StoredBytes, c.Placed), nil
		}
	}
	return nil, "", "", fmt.Errorf("chosen worker %s vanished", c.Node)
}

// followRecord places the series on the worker its placement annotation names when that
// worker holds it. It waits (no placement, a reason) while that worker is missing or does not
// answer, and ignores the record (nothing returned) when the worker answers without the
// series: a record copied or written by hand must not choose a worker that holds nothing (one
// nearly full, say).
func (r *BackupSeriesReconciler) followRecord(ctx context.Context, bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media,
	node string) (_ *backupv1alpha1.WorkerPlacement, reason, msg string, _ error) {
	w, found, err := r.Workers.OnNode(ctx, media, node)
	if err != nil {
		return nil, "", "", err
	}
	howToDrop := fmt.Sprintf("if that store is gone for good, remove the annotation (kubectl annotate backupseries %s %s-)",
		bs.Name, backupv1alpha1.PlacementAnnotation)
	if !found {
		// No worker, and no storage node of that name either (a cluster the series was
		// restored into, with other node names): nothing there can hold it; place it as new,
		// which finds the worker that holds it, if any.
		var n corev1.Node
		if err := r.Get(ctx, client.ObjectKey{Name: node}, &n); apierrors.IsNotFound(err) {
			return nil, "", "", nil
		} else if err != nil {
			return nil, "", "", err
		}
	}
	if !found || !w.Ready {
		return nil, "RecordedWorkerMissing", fmt.Sprintf("placed on the %s worker on node %s before (annotation %s), which is not ready: "+
			"the series waits for its data there; %s", media, node, backupv1alpha1.PlacementAnnotation, howToDrop), nil
	}
	api, err := r.Workers.API(ctx, media, node)
	if err != nil {
		return nil, "", "", err
	}
	d, err := api.Series(ctx, bs.Namespace, bs.Name)
	switch {
	case err == nil && d.Versions == 0:
		// Only the emptied record of a series that moved away (a BackupSeries restored from
		// before its move): look for the worker that holds its versions.
		return nil, "", "", nil
	case err == nil:
		return r.Workers.Placement(w), "Recorded", fmt.Sprintf("placed on the %s worker on node %s before (annotation %s), which holds it",
			media, node, backupv1alpha1.PlacementAnnotation), nil
	case workerclient.IsNotFound(err):
		return nil, "", "", nil
	default:
		return nil, "RecordedWorkerMissing", fmt.Sprintf("placed on the %s worker on node %s before (annotation %s), which does not answer (%v): "+
			"the series waits for its data there; %s", media, node, backupv1alpha1.PlacementAnnotation, err, howToDrop), nil
	}
}

// recordedNode is the node of the series' placement annotation, when it names one of media (a
// record for another media, e.g. after spec.storage.media changed before the first placement,
// is not followed).
func recordedNode(bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media) (string, bool) {
	ref, ok := plan.ParseStoreRef(bs.Annotations[backupv1alpha1.PlacementAnnotation])
	if !ok || ref.Media != media {
		return "", false
	}
	return ref.Node, true
}

// recordPlacement writes the placement annotation (a metadata patch; the spec is untouched).
func (r *BackupSeriesReconciler) recordPlacement(ctx context.Context, bs *backupv1alpha1.BackupSeries, p *backupv1alpha1.WorkerPlacement) error {
	return r.setAnnotations(ctx, bs, map[string]string{backupv1alpha1.PlacementAnnotation: plan.StoreOf(p).String()})
}

// noWorkerReason is NoSpace when reachable workers exist and every one is nearly full.
func noWorkerReason(cands []plan.Candidate) string {
	full := 0
	for _, c := range cands {
		if c.Reachable {
			if c.NearlyFull() == "" {
				return "NoWorker"
			}
			full++
		}
	}
	if full > 0 {
		return "NoSpace"
	}
	return "NoWorker"
}

func noWorkerMessage(media backupv1alpha1.Media, cands []plan.Candidate, problems []string) string {
	switch {
	case noWorkerReason(cands) == "NoSpace":
		return fmt.Sprintf("every %s worker is nearly full (%s): free room on them, or add a node labelled %s=%s",
			media, joinMax(problems, 4), backupv1alpha1.StorageLabel, media)
	case len(problems) > 0:
		return fmt.Sprintf("no reachable %s worker (%s)", media, joinMax(problems, 4))
	default:
		return fmt.Sprintf("no ready %s worker: label nodes %s=%s", media, backupv1alpha1.StorageLabel, media)
	}
}

// reportedRoom is the room a worker reports in its stats, nil when it reports none (an older
// worker), with the share that must stay free.
func (r *BackupSeriesReconciler) reportedRoom(s *workerclient.Stats) *plan.Room {
	degraded := ""
	if s.Degraded != nil {
		degraded = *s.Degraded
	}
	d := s.Disk
	if d == nil {
		if degraded != "" {
			return &plan.Room{Degraded: degraded}
		}
		return nil
	}
	return &plan.Room{DataTotal: d.DataTotalBytes, DataFree: d.DataFreeBytes,
		MetaTotal: d.MetaTotalBytes, MetaFree: d.MetaFreeBytes, MinFreePercent: r.MinFreePercent,
		Degraded: degraded}
}

func roomOf(c plan.Candidate) string {
	if c.Room == nil {
		return "room not reported"
	}
	return plan.HumanBytes(c.Room.DataFree) + " free of " + plan.HumanBytes(c.Room.DataTotal)
}

// seriesPerNode counts the series placed on each node's worker of media.
func (r *BackupSeriesReconciler) seriesPerNode(ctx context.Context, media backupv1alpha1.Media) (map[string]int, error) {
	var all backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &all); err != nil {
		return nil, err
	}
	placed := map[string]int{}
	for _, x := range all.Items {
		if x.Status.Worker != nil && x.Status.Worker.Media == media {
			placed[x.Status.Worker.Node]++
		}
	}
	return placed, nil
}

// candidates asks each worker of media about the series. A worker that already holds it is
// returned as adopted, ending the search: the series' data is there. Otherwise every ready worker
// serving its own node's store is a candidate (an unreachable one too, which plan.ChooseWorker
// passes over), and problems says what is wrong with the others.
func (r *BackupSeriesReconciler) candidates(ctx context.Context, bs *backupv1alpha1.BackupSeries, media backupv1alpha1.Media,
	ws []Worker, placed map[string]int) (adopted *Worker, cands []plan.Candidate, problems []string, _ error) {
	// A worker with only the emptied record of the series (every version deleted, or moved
	// away) is where it goes when no worker holds versions of it: that worker's numbering is
	// the series', and it never gives a number twice.
	var emptied *Worker
	answered := true // every worker answered whether it holds the series
	defer func() {
		if adopted == nil && emptied != nil && answered {
			adopted, cands, problems = emptied, nil, nil
		}
	}()
	for i, w := range ws {
		if !w.Ready {
			answered = false
			problems = append(problems, fmt.Sprintf("%s: pod %s not ready", w.Node, w.Pod))
			continue
		}
		api, err := r.Workers.API(ctx, media, w.Node)
		if err != nil {
			return nil, nil, nil, err
		}
		d, err := api.Series(ctx, bs.Namespace, bs.Name)
		if err == nil && d.Versions > 0 {
			return &ws[i], nil, nil, nil
		}
		if err == nil && emptied == nil && w.Host == w.Node && d.MovedTo == nil {
			emptied = &ws[i]
		}
		// Not there, or only the record of a series that left (moved away, or every version
		// deleted): no data to follow there.
		absent := err == nil || workerclient.IsNotFound(err)
		answered = answered && absent
		if w.Host != w.Node {
			// An adopted store (a lost node's, rebuilt on w.Host) serves the series it holds
			// until it is given back; a new series goes to a node's own worker, so nothing
			// new is tied to a node that is gone.
			if !absent {
				problems = append(problems, fmt.Sprintf("%s (adopted on %s): %v", w.Node, w.Host, err))
			}
			continue
		}
		if !absent {
			problems = append(problems, fmt.Sprintf("%s: %v", w.Node, err))
			cands = append(cands, plan.Candidate{Node: w.Node, Pod: w.Pod})
			continue
		}
		c, problem, err := r.newSeriesCandidate(ctx, api, w, placed)
		if err != nil {
			return nil, nil, nil, err
		}
		if problem != "" {
			problems = append(problems, fmt.Sprintf("%s: %s", w.Node, problem))
		}
		if c != nil {
			cands = append(cands, *c)
		}
	}
	return nil, cands, problems, nil
}

// newSeriesCandidate is what a ready worker of its own node that does not hold the series offers
// a new one (nil when it is drained), and what is wrong with it.
func (r *BackupSeriesReconciler) newSeriesCandidate(ctx context.Context, api *instrumented, w Worker,
	placed map[string]int) (*plan.Candidate, string, error) {
	if d, err := r.draining(ctx, w.Node); err != nil || d {
		return nil, "drained (annotation " + backupv1alpha1.DrainAnnotation + ")", err
	}
	s, err := api.Stats(ctx)
	c := &plan.Candidate{Node: w.Node, Pod: w.Pod, Reachable: err == nil, Placed: placed[w.Node]}
	if err != nil {
		return c, err.Error(), nil
	}
	c.StoredBytes = s.ContainerBytes
	c.Room = r.reportedRoom(s)
	return c, c.NearlyFull(), nil
}
