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
		if p.wanted[pn.media] {
			p.services[pn] = true
		}
	}
	return nil
}

// adoptIfLost adopts store st when its node is lost and another node of its pool can take it;
// otherwise it shortens the requeue to when that may change.
func (r *WorkerPoolReconciler) adoptIfLost(ctx context.Context, p *poolsRun, st poolNode) error {
	lost, why, wait, err := r.nodeLost(ctx, st)
	if err != nil {
		return err
	}
	if !lost {
		if wait > 0 && wait < p.requeue {
			p.requeue = wait
		}
		return nil
	}
	// Only where another node of the pool can take the store: a lone node's store waits for
	// its node, which may yet come back with it.
	ok, err := r.otherReadyNode(ctx, st)
	if err != nil {
		return err
	}
	if !ok {
		logf.FromContext(ctx).Info("a lost node's store waits: no other ready node of its pool", "node", st.node, "media", st.media)
		if p.requeue > time.Minute {
			p.requeue = time.Minute
		}
		return nil
	}
	if err := r.adopt(ctx, st, why); err != nil {
		return err
	}
	p.adopted[st] = true
	p.services[st] = true
	return nil
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

// nodeLost says whether the node of store st is lost (and why), or how long until a node that
// is NotReady now would count as lost. A node that is gone counts as lost once no worker pod
// of its pool is left on it: a pod still terminating may be handing its last backups to the
// bucket.
func (r *WorkerPoolReconciler) nodeLost(ctx context.Context, st poolNode) (bool, string, time.Duration, error) {
	var n corev1.Node
	err := r.Get(ctx, client.ObjectKey{Name: st.node}, &n)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && n.Labels[backupv1alpha1.StorageLabel] != st.media):
		running, err := r.workerPodOn(ctx, st)
		if err != nil || running != "" {
			return false, "", 10 * time.Second, err
		}
		return true, fmt.Sprintf("node %s is gone (deleted, or no longer labelled %s=%s)", st.node, backupv1alpha1.StorageLabel, st.media), 0, nil
	case err != nil:
		return false, "", 0, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		down := r.Now().Sub(c.LastTransitionTime.Time)
		limit := r.Config.Remote.LostNodeTimeout.Duration
		if down >= limit {
			return true, fmt.Sprintf("node %s has been NotReady for %s (remote.lostNodeTimeout %s)", st.node, down.Round(time.Second), limit), 0, nil
		}
		return false, "", limit - down + time.Second, nil
	}
	return false, "", 0, nil
}

// otherReadyNode says whether a Ready node of st's pool other than st's node exists.
func (r *WorkerPoolReconciler) otherReadyNode(ctx context.Context, st poolNode) (bool, error) {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, client.MatchingLabels{backupv1alpha1.StorageLabel: st.media}); err != nil {
		return false, err
	}
	for _, n := range nodes.Items {
		if n.Name == st.node || n.Spec.Unschedulable {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
	}
	return false, nil
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

// adopt creates the Deployment that rebuilds store st elsewhere, and says so on the series
// placed there.
func (r *WorkerPoolReconciler) adopt(ctx context.Context, st poolNode, why string) error {
	pool, ok := r.Config.Pool(backupv1alpha1.Media(st.media))
	if !ok {
		return nil
	}
	d := plan.AdoptedStore(r.Config, pool, st.node)
	if err := apply(ctx, r.Client, r.Scheme, d); err != nil {
		return fmt.Errorf("adopting the store of node %s: %w", st.node, err)
	}
	msg := fmt.Sprintf("%s: its %s store is rebuilt from the remote on another %s node (Deployment %s); backups continue there",
		why, st.media, st.media, d.Name)
	logf.FromContext(ctx).Info("adopting the store of a lost node", "node", st.node, "media", st.media, "deployment", d.Name, "why", why)
	var list backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &list); err != nil {
		return err
	}
	for i := range list.Items {
		bs := &list.Items[i]
		if w := bs.Status.Worker; w != nil && string(w.Media) == st.media && w.Node == st.node {
			note := msg
			if s := bs.Status; s.LatestVersion > s.DurableVersion {
				note += fmt.Sprintf("; the bucket held versions up to %d of this series, versions %d to %d stayed on the lost node",
					s.DurableVersion, s.DurableVersion+1, s.LatestVersion)
			}
			r.Recorder.Event(bs, corev1.EventTypeWarning, "StoreAdopted", note)
		}
	}
	return nil
}
