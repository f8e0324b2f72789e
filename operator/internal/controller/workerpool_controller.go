package controller

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
)

// WorkerPoolReconciler keeps the worker pools: a DaemonSet per configured media, the label
// revault.io/node on each worker pod, a Service per (pool, node), and the worker token Secret.
// It has no custom resource: everything it reconciles hangs off one fixed request.
type WorkerPoolReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Config   *config.Config
	Tokens   *tokens.Manager
	Recorder record.EventRecorder
	// Now is the clock (how long a node has been NotReady).
	Now func() time.Time
}

// +kubebuilder:rbac:groups=apps,namespace=system,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,namespace=system,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=pods,verbs=patch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

const poolsRequestName = "worker-pools"

func (r *WorkerPoolReconciler) request() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Config.Namespace, Name: poolsRequestName}}
}

// poolsRun is one reconcile of the worker pools: which pools are configured, and which (pool,
// node) pairs should have a worker Service.
type poolsRun struct {
	wanted   map[string]bool
	services map[poolNode]bool
	// adopted: the stores of lost nodes, served elsewhere (an adoption Deployment each).
	adopted map[poolNode]bool
	// hosting counts the adopted stores each node keeps (the spare with fewest is chosen).
	hosting map[string]int
	// requeue is when to look again (a node NotReady, not yet long enough to count as lost).
	requeue time.Duration
}

// poolNode is a pool's media and a node name.
type poolNode struct{ media, node string }

// Reconcile brings the pools to the configured state, in these steps.
func (r *WorkerPoolReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("workerpool", err) }()
	p := &poolsRun{wanted: map[string]bool{}, services: map[poolNode]bool{}, adopted: map[poolNode]bool{}, hosting: map[string]int{},
		// Revoke tokens of deleted namespaces now and then even when nothing else happens.
		requeue: 10 * time.Minute}
	if _, err := runSteps(ctx, p,
		r.tokens,       // the worker token Secret, without the tokens of deleted namespaces
		r.daemonSets,   // a DaemonSet per configured pool, none for the others
		r.adoptions,    // the stores of lost nodes rebuilt elsewhere (with a remote)
		r.workerPods,   // each worker pod labelled with its node, and a Service wanted for it
		r.storageNodes, // a Service wanted for each node labelled for a pool
		r.services,     // the wanted Services, and no others
	); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: p.requeue}, nil
}

// tokens keeps the worker token Secret and revokes the tokens of namespaces that are gone.
func (r *WorkerPoolReconciler) tokens(ctx context.Context, _ *poolsRun) (ctrl.Result, bool, error) {
	if err := r.Tokens.EnsureWorkerSecret(ctx); err != nil {
		return failed(fmt.Errorf("worker token secret: %w", err))
	}
	removed, invalid, err := r.Tokens.Prune(ctx)
	if err != nil {
		return failed(fmt.Errorf("pruning worker tokens: %w", err))
	}
	if len(removed) > 0 {
		logf.FromContext(ctx).Info("revoked the tokens of deleted namespaces", "namespaces", removed)
	}
	for ns, err := range invalid {
		logf.FromContext(ctx).Info("a namespace's quota annotation does not parse; it has no quota", "namespace", ns, "error", err.Error())
	}
	return proceed()
}

// daemonSets applies a DaemonSet per configured pool and deletes those of pools no longer
// configured.
func (r *WorkerPoolReconciler) daemonSets(ctx context.Context, p *poolsRun) (ctrl.Result, bool, error) {
	for _, pool := range r.Config.Pools {
		p.wanted[string(pool.Media)] = true
		if err := apply(ctx, r.Client, r.Scheme, plan.WorkerDaemonSet(r.Config, pool)); err != nil {
			return failed(fmt.Errorf("daemonset for pool %s: %w", pool.Media, err))
		}
	}
	var dss appsv1.DaemonSetList
	if err := r.List(ctx, &dss, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelManagedBy: plan.ManagedBy, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return failed(err)
	}
	for i := range dss.Items {
		ds := &dss.Items[i]
		if !p.wanted[ds.Labels[plan.LabelPool]] {
			logf.FromContext(ctx).Info("deleting the DaemonSet of a pool that is no longer configured", "daemonset", ds.Name)
			if err := r.Delete(ctx, ds); client.IgnoreNotFound(err) != nil {
				return failed(err)
			}
		}
	}
	return proceed()
}

// workerPods labels each worker pod of a configured pool with its node (the node's Service
// selects the pod by it), and wants a Service for each. An adopted store's pod carries the lost
// node's label from its template; a worker on a node whose store was adopted (the node came
// back with a stale copy, which the store's new generation fences out) loses the label, so no
// Service sends it traffic.
func (r *WorkerPoolReconciler) workerPods(ctx context.Context, p *poolsRun) (ctrl.Result, bool, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelName: plan.PartOf, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return failed(err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		media := pod.Labels[plan.LabelPool]
		node := storeNode(pod)
		if pod.Spec.NodeName == "" || node == "" || !p.wanted[media] {
			continue
		}
		p.services[poolNode{media, node}] = true
		if pod.Labels[plan.LabelAdopted] == "true" {
			continue
		}
		want, stale := plan.LabelValue(node), p.adopted[poolNode{media, node}]
		if (!stale && pod.Labels[plan.LabelNode] == want) || (stale && pod.Labels[plan.LabelNode] == "") {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		if stale {
			delete(pod.Labels, plan.LabelNode)
		} else {
			pod.Labels[plan.LabelNode] = want
		}
		if err := r.Patch(ctx, pod, patch); client.IgnoreNotFound(err) != nil {
			return failed(fmt.Errorf("labelling worker pod %s: %w", pod.Name, err))
		}
	}
	return proceed()
}

// storageNodes wants a Service for each node labelled for a configured pool, before its worker
// pod runs.
func (r *WorkerPoolReconciler) storageNodes(ctx context.Context, p *poolsRun) (ctrl.Result, bool, error) {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return failed(err)
	}
	for _, n := range nodes.Items {
		if media := n.Labels[backupv1alpha1.StorageLabel]; p.wanted[media] {
			p.services[poolNode{media, n.Name}] = true
		}
	}
	return proceed()
}

// services applies the wanted worker Services and deletes the others (their worker is gone).
func (r *WorkerPoolReconciler) services(ctx context.Context, p *poolsRun) (ctrl.Result, bool, error) {
	for pn := range p.services {
		if err := apply(ctx, r.Client, r.Scheme, plan.WorkerService(r.Config, pn.media, pn.node)); err != nil {
			return failed(fmt.Errorf("service for %s worker on %s: %w", pn.media, pn.node, err))
		}
	}
	var svcs corev1.ServiceList
	if err := r.List(ctx, &svcs, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelManagedBy: plan.ManagedBy, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return failed(err)
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		if !p.services[poolNode{s.Labels[plan.LabelPool], s.Annotations[plan.AnnotationNode]}] {
			logf.FromContext(ctx).Info("deleting the Service of a worker that is gone", "service", s.Name)
			if err := r.Delete(ctx, s); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return failed(err)
			}
		}
	}
	return proceed()
}

// SetupWithManager watches what the pools consist of; every event maps to the one request.
func (r *WorkerPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{r.request()}
	})
	start := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(r.request())
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("workerpool").
		WatchesRawSource(start).
		Watches(&appsv1.DaemonSet{}, one).
		Watches(&corev1.Service{}, one).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if o.GetNamespace() != r.Config.Namespace || o.GetLabels()[plan.LabelComponent] != plan.ComponentWorker {
				return nil
			}
			return []reconcile.Request{r.request()}
		})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if o.GetName() != plan.WorkerTokensSecret {
				return nil
			}
			return []reconcile.Request{r.request()}
		})).
		Watches(&corev1.Node{}, one).
		// A namespace's quota annotation changed, or a namespace came or went (the predicate
		// passes those too): the quota file and the tokens (Prune).
		Watches(&corev1.Namespace{}, one, builder.WithPredicates(predicate.AnnotationChangedPredicate{})).
		Watches(&appsv1.Deployment{}, one).
		Watches(&backupv1alpha1.BackupSeries{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			// A series placed on a node: that node's store matters if the node is lost.
			if bs, ok := o.(*backupv1alpha1.BackupSeries); !ok || bs.Status.Worker == nil || r.Config.Remote == nil {
				return nil
			}
			return []reconcile.Request{r.request()}
		})).
		Complete(r)
}

// outcome is what a reconcile amounted to, for the revault_operator_reconcile_outcomes_total
// metric: api_error when it returned an error, worker_error when a worker call failed (those end
// in a condition and a retry, not an error), requeue when it is waiting for something (no worker
// yet, a missing object), success otherwise.
type outcome struct {
	workerFailed bool
	waiting      bool
}

func (o *outcome) record(controller string, err error) {
	v := "success"
	switch {
	case err != nil:
		v = "api_error"
	case o.workerFailed:
		v = "worker_error"
	case o.waiting:
		v = "requeue"
	}
	metrics.ReconcileOutcomes.WithLabelValues(controller, v).Inc()
}
