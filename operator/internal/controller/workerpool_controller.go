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
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
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
	Scheme *runtime.Scheme
	Config *config.Config
	Tokens *tokens.Manager
}

// +kubebuilder:rbac:groups=apps,namespace=system,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=system,resources=pods,verbs=patch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

const poolsRequestName = "worker-pools"

func (r *WorkerPoolReconciler) request() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Config.Namespace, Name: poolsRequestName}}
}

// Reconcile brings the pools to the configured state.
func (r *WorkerPoolReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("workerpool", err) }()
	log := logf.FromContext(ctx)

	if err := r.Tokens.EnsureWorkerSecret(ctx); err != nil {
		return ctrl.Result{}, fmt.Errorf("worker token secret: %w", err)
	}
	if removed, err := r.Tokens.Prune(ctx); err != nil {
		return ctrl.Result{}, fmt.Errorf("pruning worker tokens: %w", err)
	} else if len(removed) > 0 {
		log.Info("revoked the tokens of deleted namespaces", "namespaces", removed)
	}

	wanted := map[string]bool{}
	for _, p := range r.Config.Pools {
		wanted[string(p.Media)] = true
		if err := apply(ctx, r.Client, r.Scheme, plan.WorkerDaemonSet(r.Config, p)); err != nil {
			return ctrl.Result{}, fmt.Errorf("daemonset for pool %s: %w", p.Media, err)
		}
	}
	var dss appsv1.DaemonSetList
	if err := r.List(ctx, &dss, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelManagedBy: plan.ManagedBy, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range dss.Items {
		ds := &dss.Items[i]
		if !wanted[ds.Labels[plan.LabelPool]] {
			log.Info("deleting the DaemonSet of a pool that is no longer configured", "daemonset", ds.Name)
			if err := r.Delete(ctx, ds); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
	}

	// Label each worker pod with its node, and want a Service for each (pool, node) that has a
	// worker pod or a node labelled for the pool.
	type poolNode struct{ media, node string }
	services := map[poolNode]bool{}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelName: plan.PartOf, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		media := p.Labels[plan.LabelPool]
		if p.Spec.NodeName == "" || !wanted[media] {
			continue
		}
		services[poolNode{media, p.Spec.NodeName}] = true
		want := plan.LabelValue(p.Spec.NodeName)
		if p.Labels[plan.LabelNode] == want {
			continue
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Labels[plan.LabelNode] = want
		if err := r.Patch(ctx, p, patch); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("labelling worker pod %s: %w", p.Name, err)
		}
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, err
	}
	for _, n := range nodes.Items {
		if media := n.Labels[backupv1alpha1.StorageLabel]; wanted[media] {
			services[poolNode{media, n.Name}] = true
		}
	}
	for pn := range services {
		if err := apply(ctx, r.Client, r.Scheme, plan.WorkerService(r.Config, pn.media, pn.node)); err != nil {
			return ctrl.Result{}, fmt.Errorf("service for %s worker on %s: %w", pn.media, pn.node, err)
		}
	}
	var svcs corev1.ServiceList
	if err := r.List(ctx, &svcs, client.InNamespace(r.Config.Namespace),
		client.MatchingLabels{plan.LabelManagedBy: plan.ManagedBy, plan.LabelComponent: plan.ComponentWorker}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		if !services[poolNode{s.Labels[plan.LabelPool], s.Annotations[plan.AnnotationNode]}] {
			log.Info("deleting the Service of a worker that is gone", "service", s.Name)
			if err := r.Delete(ctx, s); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return ctrl.Result{}, err
			}
		}
	}
	// Revoke tokens of deleted namespaces now and then even when nothing else happens.
	return ctrl.Result{RequeueAfter: 10 * time.Minute}, nil
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
