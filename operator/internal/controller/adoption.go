package controller

import (
	"context"
	"fmt"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// adoptions keeps the stores of lost nodes served. With a remote, every store has a copy in
// the bucket; when the node holding a store that series are placed on is lost — its Node
// deleted (or no longer labelled for the pool), or NotReady for longer than
// remote.lostNodeTimeout — the store is rebuilt from the bucket on another node of the pool by
// an adoption Deployment (plan.AdoptedStore), whose pod the node's Service then reaches: the
// series keep their placement (the store), and with it their whole history. Adoptions are
// never undone by the operator (docs/operator.md, "Losing a node").
func (r *WorkerPoolReconciler) adoptions(ctx context.Context, p *poolsRun) (ctrl.Result, bool, error) {
	if err := r.knownAdoptions(ctx, p); err != nil {
		return failed(err)
	}
	if r.Config.Remote == nil {
		return proceed()
	}
	stores, err := r.placedStores(ctx)
	if err != nil {
		return failed(err)
	}
	served, err := r.servedStores(ctx)
	if err != nil {
		return failed(err)
	}
	for _, st := range stores {
		// Only a store a worker served (its Service exists): a placement naming a node that
		// never had a worker is not a lost store.
		if p.adopted[st] || !p.wanted[st.media] || !served[st] {
			continue
		}
		if err := r.adoptIfLost(ctx, p, st); err != nil {
			return failed(err)
		}
	}
	return proceed()
}

// knownAdoptions records the adoption Deployments that exist: their stores stay adopted and
// keep their Service.
func (r *WorkerPoolReconciler) knownAdoptions(ctx context.Context, p *poolsRun) error {
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps, client.InNamespace(r.Config.Namespace), client.MatchingLabels{plan.LabelAdopted: "true"}); err != nil {
		return err
	}
	for _, d := range deps.Items {
		pn := poolNode{d.Labels[plan.LabelPool], d.Annotations[plan.AnnotationNode]}
		p.adopted[pn] = true
		p.hosting[d.Annotations[plan.AnnotationHost]]++
		if p.wanted[pn.media] {
			p.services[pn] = true
		}
	}
	return nil
}

// adoptIfLost adopts store st when its node is lost, the bucket holds what adoption needs
// (plan.AdoptionHold), and another node of its pool can keep it; otherwise it shortens the
// requeue to when that may change.
func (r *WorkerPoolReconciler) adoptIfLost(ctx context.Context, p *poolsRun, st poolNode) error {
	loss, err := r.nodeLost(ctx, st)
	if err != nil {
		return err
	}
	if !loss.lost {
		p.requeueWithin(loss.wait)
		return nil
	}
	placed, err := r.seriesOn(ctx, st)
	if err != nil {
		return err
	}
	if hold := plan.AdoptionHold(storeSeries(placed), loss.gone); hold != "" {
		r.held(ctx, placed, fmt.Sprintf("%s, but its store is not rebuilt elsewhere: %s", loss.why, hold))
		p.requeueWithin(time.Minute)
		return nil
	}
	// Only where another node of the pool can keep the store: a lone node's store waits for
	// its node, which may yet come back with it.
	host, err := r.spareNode(ctx, p, st)
	if err != nil {
		return err
	}
	if host == "" {
		logf.FromContext(ctx).Info("a lost node's store waits: no other ready node of its pool", "node", st.node, "media", st.media)
		p.requeueWithin(time.Minute)
		return nil
	}
	if err := r.adopt(ctx, st, host, loss.why, placed); err != nil {
		return err
	}
	p.adopted[st] = true
	p.services[st] = true
	p.hosting[host]++
	return nil
}

// requeueWithin makes the pools be looked at again within d (d > 0).
func (p *poolsRun) requeueWithin(d time.Duration) {
	if d > 0 && d < p.requeue {
		p.requeue = d
	}
}

// seriesOn are the series placed on store st.
func (r *WorkerPoolReconciler) seriesOn(ctx context.Context, st poolNode) ([]*backupv1alpha1.BackupSeries, error) {
	var list backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []*backupv1alpha1.BackupSeries
	for i := range list.Items {
		if w := list.Items[i].Status.Worker; w != nil && string(w.Media) == st.media && w.Node == st.node {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

func storeSeries(placed []*backupv1alpha1.BackupSeries) []plan.StoreSeries {
	out := make([]plan.StoreSeries, 0, len(placed))
	for _, bs := range placed {
		out = append(out, plan.StoreSeries{Name: bs.Namespace + "/" + bs.Name,
			Latest: bs.Status.LatestVersion, Durable: bs.Status.DurableVersion})
	}
	return out
}

// held says on each series why its lost node's store is not rebuilt yet (the recorder folds
// repeats of one message into a count).
func (r *WorkerPoolReconciler) held(ctx context.Context, placed []*backupv1alpha1.BackupSeries, msg string) {
	logf.FromContext(ctx).Info("a lost node's store is held", "why", msg)
	for _, bs := range placed {
		r.Recorder.Event(bs, corev1.EventTypeWarning, "StoreAdoptionHeld", msg)
	}
}

// placedStores are the (pool, node) stores series are placed on, sorted.
func (r *WorkerPoolReconciler) placedStores(ctx context.Context) ([]poolNode, error) {
	var list backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &list); err != nil {
		return nil, err
	}
	seen := map[poolNode]bool{}
	var out []poolNode
	for _, bs := range list.Items {
		if w := bs.Status.Worker; w != nil && !seen[poolNode{string(w.Media), w.Node}] {
			pn := poolNode{string(w.Media), w.Node}
			seen[pn] = true
			out = append(out, pn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].media+"/"+out[i].node < out[j].media+"/"+out[j].node })
	return out, nil
}

// servedStores are the (pool, node) stores that have a worker Service.
func (r *WorkerPoolReconciler) servedStores(ctx context.Context) (map[poolNode]bool, error) {
	var svcs corev1.ServiceList
	if err := r.List(ctx, &svcs, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelManagedBy: plan.ManagedBy, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return nil, err
	}
	out := map[poolNode]bool{}
	for _, s := range svcs.Items {
		out[poolNode{s.Labels[plan.LabelPool], s.Annotations[plan.AnnotationNode]}] = true
	}
	return out, nil
}

// nodeLoss is what nodeLost found: whether the node of a store is lost, and if so whether it
// is gone (deleted, or no longer labelled for the pool) rather than NotReady, and why; if not,
// how long until a node NotReady now would count as lost.
type nodeLoss struct {
	lost, gone bool
	why        string
	wait       time.Duration
}

// nodeLost says whether the node of store st is lost. A node that is gone counts as lost once
// no worker pod of its pool is left on it: a pod still terminating may be handing its last
// backups to the bucket.
func (r *WorkerPoolReconciler) nodeLost(ctx context.Context, st poolNode) (nodeLoss, error) {
	var n corev1.Node
	err := r.Get(ctx, client.ObjectKey{Name: st.node}, &n)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && n.Labels[backupv1alpha1.StorageLabel] != st.media):
		running, err := r.workerPodOn(ctx, st)
		if err != nil || running != "" {
			return nodeLoss{wait: 10 * time.Second}, err
		}
		return nodeLoss{lost: true, gone: true, why: fmt.Sprintf("node %s is gone (deleted, or no longer labelled %s=%s)",
			st.node, backupv1alpha1.StorageLabel, st.media)}, nil
	case err != nil:
		return nodeLoss{}, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		down := r.Now().Sub(c.LastTransitionTime.Time)
		limit := r.Config.Remote.LostNodeTimeout.Duration
		if down >= limit {
			return nodeLoss{lost: true, why: fmt.Sprintf("node %s has been NotReady for %s (remote.lostNodeTimeout %s)",
				st.node, down.Round(time.Second), limit)}, nil
		}
		return nodeLoss{wait: limit - down + time.Second}, nil
	}
	return nodeLoss{}, nil
}

// spareNode chooses the node that rebuilds and keeps store st: a Ready, schedulable node of
// its pool (its media and node selector) other than st's, keeping the fewest adopted stores,
// then by name; "" when there is none.
func (r *WorkerPoolReconciler) spareNode(ctx context.Context, p *poolsRun, st poolNode) (string, error) {
	pool, ok := r.Config.Pool(backupv1alpha1.Media(st.media))
	if !ok {
		return "", nil
	}
	sel := client.MatchingLabels{backupv1alpha1.StorageLabel: st.media}
	for k, v := range pool.NodeSelector {
		sel[k] = v
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, sel); err != nil {
		return "", err
	}
	var ready []string
	for _, n := range nodes.Items {
		if n.Name != st.node && !n.Spec.Unschedulable && nodeReady(&n) {
			ready = append(ready, n.Name)
		}
	}
	sort.Slice(ready, func(i, j int) bool {
		a, b := ready[i], ready[j]
		return p.hosting[a] < p.hosting[b] || (p.hosting[a] == p.hosting[b] && a < b)
	})
	if len(ready) == 0 {
		return "", nil
	}
	return ready[0], nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// workerPodOn names a pod of st's pool still on st's node (not adopted), if any.
func (r *WorkerPoolReconciler) workerPodOn(ctx context.Context, st poolNode) (string, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(r.Config.Namespace), client.MatchingLabels(plan.WorkerSelector(st.media))); err != nil {
		return "", err
	}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName == st.node && pod.Labels[plan.LabelAdopted] != "true" {
			return pod.Name, nil
		}
	}
	return "", nil
}

// adopt creates the Deployment that rebuilds store st on host, and says so on the series
// placed there.
func (r *WorkerPoolReconciler) adopt(ctx context.Context, st poolNode, host, why string, placed []*backupv1alpha1.BackupSeries) error {
	pool, ok := r.Config.Pool(backupv1alpha1.Media(st.media))
	if !ok {
		return nil
	}
	d := plan.AdoptedStore(r.Config, pool, st.node, host)
	if err := apply(ctx, r.Client, r.Scheme, d); err != nil {
		return fmt.Errorf("adopting the store of node %s: %w", st.node, err)
	}
	msg := fmt.Sprintf("%s: its %s store is rebuilt from the remote on node %s (Deployment %s); backups continue there",
		why, st.media, host, d.Name)
	logf.FromContext(ctx).Info("adopting the store of a lost node", "node", st.node, "media", st.media, "host", host, "deployment", d.Name, "why", why)
	for _, bs := range placed {
		note := msg
		if s := bs.Status; s.LatestVersion > s.DurableVersion {
			note += fmt.Sprintf("; the bucket held versions up to %d of this series, versions %d to %d stayed on the lost node",
				s.DurableVersion, s.DurableVersion+1, s.LatestVersion)
		}
		r.Recorder.Event(bs, corev1.EventTypeWarning, "StoreAdopted", note)
	}
	return nil
}
