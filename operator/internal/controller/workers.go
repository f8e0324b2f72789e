package controller

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/internal/workerapi"
)

// Worker is one worker pod as the operator sees it.
type Worker struct {
	Media backupv1alpha1.Media
	Node  string
	Pod   string
	Ready bool
	// Endpoint is the worker's per-node Service URL (what Job pods use).
	Endpoint string
}

// Workers finds worker pods and talks to them.
//
// Addressing: every worker pod gets the label revault.io/node=<node> from the operator, and
// every (pool, node) a Service revault-worker-<media>-<node> selecting that label, so a series
// placed on a node keeps one stable URL (http://revault-worker-ssd-node1.<ns>.svc:8420) across
// pod restarts. Overrides map a node name to another URL for the operator's own calls; they are
// for running the operator outside the cluster (and for tests, where workers run on loopback).
type Workers struct {
	Client    client.Client
	Config    *config.Config
	Tokens    *tokens.Manager
	Overrides map[string]string
}

// ParseOverrides reads "node=url,node2=url2".
func ParseOverrides(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || !strings.HasPrefix(v, "http") {
			return nil, fmt.Errorf("worker endpoint override %q: want NODE=http://HOST:PORT", kv)
		}
		out[k] = v
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// List returns the worker pods of a pool that are bound to a node, one per node (the ready one,
// else the newest), sorted by node.
func (w *Workers) List(ctx context.Context, media backupv1alpha1.Media) ([]Worker, error) {
	var pods corev1.PodList
	if err := w.Client.List(ctx, &pods, client.InNamespace(w.Config.Namespace),
		client.MatchingLabels(plan.WorkerSelector(string(media)))); err != nil {
		return nil, err
	}
	best := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		cur, ok := best[p.Spec.NodeName]
		switch {
		case !ok:
			best[p.Spec.NodeName] = p
		case podReady(p) && !podReady(cur):
			best[p.Spec.NodeName] = p
		case podReady(p) == podReady(cur) && p.CreationTimestamp.After(cur.CreationTimestamp.Time):
			best[p.Spec.NodeName] = p
		}
	}
	out := make([]Worker, 0, len(best))
	for node, p := range best {
		out = append(out, Worker{
			Media:    media,
			Node:     node,
			Pod:      p.Name,
			Ready:    podReady(p),
			Endpoint: w.endpoint(media, node),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// OnNode returns the worker of a pool on a node.
func (w *Workers) OnNode(ctx context.Context, media backupv1alpha1.Media, node string) (Worker, bool, error) {
	ws, err := w.List(ctx, media)
	if err != nil {
		return Worker{}, false, err
	}
	for _, x := range ws {
		if x.Node == node {
			return x, true, nil
		}
	}
	return Worker{}, false, nil
}

func (w *Workers) endpoint(media backupv1alpha1.Media, node string) string {
	return plan.WorkerEndpoint(plan.WorkerServiceName(string(media), node), w.Config.Namespace, w.Config.Worker.Port)
}

// Placement is the status record of a worker.
func (w *Workers) Placement(x Worker) *backupv1alpha1.WorkerPlacement {
	return &backupv1alpha1.WorkerPlacement{Media: x.Media, Node: x.Node, Pod: x.Pod, Endpoint: x.Endpoint}
}

// url is where the operator itself reaches the worker on node: its override, else its Service.
func (w *Workers) url(media backupv1alpha1.Media, node string) string {
	if u, ok := w.Overrides[node]; ok {
		return u
	}
	return w.endpoint(media, node)
}

// workerHTTP is the HTTP client of the operator's worker calls.
var workerHTTP = &http.Client{Timeout: 60 * time.Second}

// API returns a client for the worker on node (with the operator's admin token).
func (w *Workers) API(ctx context.Context, media backupv1alpha1.Media, node string) (*instrumented, error) {
	token, err := w.Tokens.AdminToken(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's worker token: %w", err)
	}
	return &instrumented{workerapi.New(w.url(media, node), token, workerHTTP)}, nil
}

// RunningBackupBytes is how many bytes the worker a series is placed on (at) has read so far of
// the backup of ns/name it is receiving; ok is false when none runs or the worker did not answer.
func (w *Workers) RunningBackupBytes(ctx context.Context, at *backupv1alpha1.WorkerPlacement, ns, name string) (_ int64, ok bool) {
	api, err := w.API(ctx, at.Media, at.Node)
	if err != nil {
		return 0, false
	}
	p, err := api.BackupProgress(ctx, ns, name)
	if err != nil || !p.Running {
		return 0, false
	}
	return p.LogicalBytes, true
}

// TokenAccepted reports whether the worker on node already accepts namespace ns's token. The
// kubelet updates the workers' token file a while (up to about a minute) after the operator
// adds a namespace, and a Job that ran before would fail with 401, so Jobs wait for this.
func (w *Workers) TokenAccepted(ctx context.Context, media backupv1alpha1.Media, node, ns string) (bool, error) {
	tok, ok, err := w.Tokens.NamespaceToken(ctx, ns)
	if err != nil || !ok {
		return false, err
	}
	// Only the namespace's token is used here: no admin client (and no read of its token).
	scoped := workerapi.New(w.url(media, node), tok, workerHTTP)
	_, err = call("list_series", func() ([]workerapi.Series, error) { return scoped.ListSeries(ctx, ns) })
	switch {
	case err == nil:
		return true, nil
	case workerapi.IsUnauthorized(err):
		return false, nil
	default:
		return false, err
	}
}

// versionsAt lists a worker's versions of a series with their times (for plan.ResolveVersion
// and plan.Expiring).
func versionsAt(s *workerapi.Series) []plan.VersionAt {
	vs := make([]plan.VersionAt, 0, len(s.VersionList))
	for _, v := range s.VersionList {
		vs = append(vs, plan.VersionAt{Number: v.Number, Time: v.Time})
	}
	return vs
}

// instrumented counts every worker call in the operator's metrics.
type instrumented struct{ c *workerapi.Client }

func call[T any](op string, fn func() (T, error)) (T, error) {
	v, err := fn()
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	metrics.WorkerRequests.WithLabelValues(op, outcome).Inc()
	return v, err
}

func (i *instrumented) Stats(ctx context.Context) (*workerapi.Stats, error) {
	return call("stats", func() (*workerapi.Stats, error) { return i.c.Stats(ctx) })
}

func (i *instrumented) Series(ctx context.Context, ns, name string) (*workerapi.Series, error) {
	return call("series", func() (*workerapi.Series, error) { return i.c.Series(ctx, ns, name) })
}

func (i *instrumented) DeleteSeries(ctx context.Context, ns, name string) (*workerapi.ExpireReport, error) {
	return call("delete_series", func() (*workerapi.ExpireReport, error) { return i.c.DeleteSeries(ctx, ns, name) })
}

func (i *instrumented) PutRetention(ctx context.Context, ns, name string, r workerapi.Retention) (*workerapi.Retention, error) {
	return call("put_retention", func() (*workerapi.Retention, error) { return i.c.PutRetention(ctx, ns, name, r) })
}

func (i *instrumented) Slide(ctx context.Context, ns, name string) (*workerapi.SlideReport, error) {
	return call("slide", func() (*workerapi.SlideReport, error) { return i.c.Slide(ctx, ns, name) })
}

func (i *instrumented) ExpireByRetention(ctx context.Context, ns, name string) (*workerapi.ExpireReport, error) {
	return call("expire", func() (*workerapi.ExpireReport, error) { return i.c.ExpireByRetention(ctx, ns, name) })
}

func (i *instrumented) BackupProgress(ctx context.Context, ns, name string) (*workerapi.BackupProgress, error) {
	return call("backup_progress", func() (*workerapi.BackupProgress, error) { return i.c.BackupProgress(ctx, ns, name) })
}
