package controller

import (
	"context"
	"fmt"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/workerapi"
)

// place chooses a worker for a series: the worker that already holds it (status is lost when a
// BackupSeries is recreated, e.g. restored from a cluster backup), else the least used reachable
// worker of its media.
func (r *BackupSeriesReconciler) place(ctx context.Context, bs *backupv1alpha1.BackupSeries) (
	_ *backupv1alpha1.WorkerPlacement, reason, msg string, _ error) {
	media := bs.Spec.Storage.Media
	if media == "" {
		media = backupv1alpha1.MediaSSD
	}
	if _, ok := r.Config.Pool(media); !ok {
		return nil, "NoWorker", fmt.Sprintf("the operator runs no %s worker pool", media), nil
	}
	ws, err := r.Workers.List(ctx, media)
	if err != nil {
		return nil, "", "", err
	}
	var all backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &all); err != nil {
		return nil, "", "", err
	}
	placed := map[string]int{}
	for _, x := range all.Items {
		if x.Status.Worker != nil && x.Status.Worker.Media == media {
			placed[x.Status.Worker.Node]++
		}
	}
	var cands []plan.Candidate
	var problems []string
	for _, w := range ws {
		if !w.Ready {
			problems = append(problems, fmt.Sprintf("%s: pod %s not ready", w.Node, w.Pod))
			continue
		}
		api, err := r.Workers.API(ctx, media, w.Node)
		if err != nil {
			return nil, "", "", err
		}
		if _, err := api.Series(ctx, bs.Namespace, bs.Name); err == nil {
			return r.Workers.Placement(w), "Adopted", fmt.Sprintf("the %s worker on node %s already holds series %s",
				media, w.Node, plan.SeriesID(bs.Namespace, bs.Name)), nil
		} else if !workerapi.IsNotFound(err) {
			problems = append(problems, fmt.Sprintf("%s: %v", w.Node, err))
			cands = append(cands, plan.Candidate{Node: w.Node, Pod: w.Pod})
			continue
		}
		s, err := api.Stats(ctx)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", w.Node, err))
		}
		c := plan.Candidate{Node: w.Node, Pod: w.Pod, Reachable: err == nil, Placed: placed[w.Node]}
		if s != nil {
			c.StoredBytes = s.ContainerBytes
		}
		cands = append(cands, c)
	}
	c, ok := plan.ChooseWorker(cands)
	if !ok {
		msg := fmt.Sprintf("no ready %s worker: label nodes %s=%s", media, backupv1alpha1.StorageLabel, media)
		if len(problems) > 0 {
			msg = fmt.Sprintf("no reachable %s worker (%s)", media, joinMax(problems, 4))
		}
		return nil, "NoWorker", msg, nil
	}
	for _, w := range ws {
		if w.Node == c.Node {
			return r.Workers.Placement(w), "WorkerSelected", fmt.Sprintf("least used %s worker: node %s (%d stored bytes, %d series)",
				media, c.Node, c.StoredBytes, c.Placed), nil
		}
	}
	return nil, "", "", fmt.Errorf("chosen worker %s vanished", c.Node)
}
