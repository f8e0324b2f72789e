package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/certs"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// Worker is one worker pod as the operator sees it.
type Worker struct {
	Media backupv1alpha1.Media
	// Node is the node whose store the worker serves: the node it runs on, or, for the store
	// of a lost node rebuilt elsewhere (an adopted store), the lost node.
	Node string
	// Host is the node the pod runs on.
	Host  string
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
	// Limits bounds every call to a worker; Health remembers which workers did not answer.
	Limits CallLimits
	Health *WorkerHealth
	// Certs is the workers' CA (nil: workers serve plain HTTP).
	Certs *certs.Manager
	// roots is the CA pool the TLS clients verify with; transports their clients by worker.
	roots      atomic.Pointer[x509.CertPool]
	transports sync.Map
}

// ParseOverrides reads "node=url,node2=url2". With TLS on (tls) only https:// is accepted: a
// plain-HTTP override would send the operator's admin token in clear.
func ParseOverrides(s string, tls bool) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		secure := strings.HasPrefix(v, "https://")
		if !ok || k == "" || (!secure && !strings.HasPrefix(v, "http://")) {
			return nil, fmt.Errorf("worker endpoint override %q: want NODE=https://HOST:PORT (or http:// without TLS)", kv)
		}
		if tls && !secure {
			return nil, fmt.Errorf("worker endpoint override %q: the workers serve TLS (config tls), so the override must be https://", kv)
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

// storeNode is the node whose store a worker pod serves: the lost node an adopted store's pod
// is annotated with, else the node it runs on.
func storeNode(p *corev1.Pod) string {
	if p.Labels[plan.LabelAdopted] == "true" {
		return p.Annotations[plan.AnnotationNode]
	}
	return p.Spec.NodeName
}

// Adopted lists the nodes of a pool whose stores were rebuilt elsewhere (an adoption
// Deployment exists for each).
func (w *Workers) Adopted(ctx context.Context, media backupv1alpha1.Media) (map[string]bool, error) {
	var deps appsv1.DeploymentList
	if err := w.Client.List(ctx, &deps, client.InNamespace(w.Config.Namespace),
		client.MatchingLabels{plan.LabelAdopted: "true", plan.LabelPool: string(media)}); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, d := range deps.Items {
		out[d.Annotations[plan.AnnotationNode]] = true
	}
	return out, nil
}

// List returns the worker pods of a pool that are bound to a node, one per store (the ready
// one, else the newest), sorted by node. A worker on a node whose store was adopted elsewhere
// serves a stale, fenced copy and is left out.
func (w *Workers) List(ctx context.Context, media backupv1alpha1.Media) ([]Worker, error) {
	var pods corev1.PodList
	if err := w.Client.List(ctx, &pods, client.InNamespace(w.Config.Namespace),
		client.MatchingLabels(plan.WorkerSelector(string(media)))); err != nil {
		return nil, err
	}
	adopted, err := w.Adopted(ctx, media)
	if err != nil {
		return nil, err
	}
	best := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		node := storeNode(p)
		if p.Spec.NodeName == "" || node == "" || (adopted[node] && p.Labels[plan.LabelAdopted] != "true") {
			continue
		}
		cur, ok := best[node]
		switch {
		case !ok:
			best[node] = p
		case podReady(p) && !podReady(cur):
			best[node] = p
		case podReady(p) == podReady(cur) && p.CreationTimestamp.After(cur.CreationTimestamp.Time):
			best[node] = p
		}
	}
	out := make([]Worker, 0, len(best))
	for node, p := range best {
		out = append(out, Worker{
			Media:    media,
			Node:     node,
			Host:     p.Spec.NodeName,
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
	return plan.WorkerEndpoint(plan.WorkerServiceName(string(media), node), w.Config.Namespace, w.Config.Worker.Port, w.Config.TLSOn())
}

// GrantNamespace gives namespace ns what its Job pods need to reach the workers: its token and,
// with TLS, the CA bundle.
func (w *Workers) GrantNamespace(ctx context.Context, ns string) error {
	if err := w.Tokens.EnsureNamespace(ctx, ns); err != nil {
		return fmt.Errorf("namespace token: %w", err)
	}
	if w.Certs == nil {
		return nil
	}
	if err := w.Certs.EnsureNamespace(ctx, ns); err != nil {
		return fmt.Errorf("namespace CA bundle: %w", err)
	}
	return nil
}

// credentialsWaitFor is how a series or restore waits for the workers' CA bundle.
type credentialsWaitFor struct {
	reason, msg string
	warn        bool
	after       time.Duration
}

// grantOrWait is GrantNamespace for a reconciler: nil, nil when granted; how to wait when the
// CA bundle is missing or unusable (a status can explain it, and only an operator's or
// cert-manager's action fixes it); or the error, retried with backoff.
func (w *Workers) grantOrWait(ctx context.Context, ns string) (*credentialsWaitFor, error) {
	err := w.GrantNamespace(ctx, ns)
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, certs.ErrNotIssued):
		// Just after install, or while cert-manager issues tls.secret.
		return &credentialsWaitFor{reason: "CertificatePending", msg: err.Error(), after: 15 * time.Second}, nil
	case errors.Is(err, certs.ErrBadBundle):
		return &credentialsWaitFor{reason: "CredentialsUnavailable", msg: err.Error(), warn: true, after: 30 * time.Second}, nil
	}
	return nil, err
}

// Holders finds the workers, of every pool, that hold version of series ns/name, asking every
// ready worker (a worker may keep an empty record of a series, e.g. after a retention push, so a
// record alone is not enough). unreachable names the workers that did not answer (the version
// may be on one of them).
func (w *Workers) Holders(ctx context.Context, ns, name string, version int64) (holders []Worker, unreachable []string, _ error) {
	for _, pool := range w.Config.Pools {
		ws, err := w.List(ctx, pool.Media)
		if err != nil {
			return nil, nil, err
		}
		for _, x := range ws {
			if !x.Ready {
				unreachable = append(unreachable, fmt.Sprintf("%s worker on %s: pod %s not ready", x.Media, x.Node, x.Pod))
				continue
			}
			api, err := w.API(ctx, x.Media, x.Node)
			if err != nil {
				return nil, nil, err
			}
			s, err := api.Series(ctx, ns, name)
			switch {
			case err == nil && slices.ContainsFunc(s.VersionList, func(v workerclient.Version) bool { return v.Number == version }):
				holders = append(holders, x)
			case err != nil && !workerclient.IsNotFound(err):
				unreachable = append(unreachable, fmt.Sprintf("%s worker on %s: %v", x.Media, x.Node, err))
			}
		}
	}
	return holders, unreachable, nil
}

// Placement is the status record of a worker.
func (w *Workers) Placement(x Worker) *backupv1alpha1.WorkerPlacement {
	return &backupv1alpha1.WorkerPlacement{Media: x.Media, Node: x.Node, Host: x.Host, Pod: x.Pod, Endpoint: x.Endpoint}
}

// url is where the operator itself reaches the worker on node: its override, else its Service.
func (w *Workers) url(media backupv1alpha1.Media, node string) string {
	if u, ok := w.Overrides[node]; ok {
		return u
	}
	return w.endpoint(media, node)
}

// workerHTTP is the HTTP client of the operator's worker calls; each call bounds itself
// (workercalls.go), this only bounds a call that somehow would not.
var workerHTTP = &http.Client{Timeout: 10 * time.Minute}

// httpFor is the client of the operator's calls to the worker on node: workerHTTP, or with TLS
// one that trusts the CA bundle and checks the name of the worker's Service, also when an
// override sends the call elsewhere (a worker on loopback in tests, a port-forward).
func (w *Workers) httpFor(ctx context.Context, media backupv1alpha1.Media, node string) (*http.Client, error) {
	if w.Certs == nil {
		return workerHTTP, nil
	}
	roots, err := w.Certs.Roots(ctx)
	if err != nil {
		return nil, err
	}
	w.roots.Store(roots)
	name := plan.WorkerServiceName(string(media), node) + "." + w.Config.Namespace + ".svc"
	if c, ok := w.transports.Load(name); ok {
		return c.(*http.Client), nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Go's own check would compare with the dialled host; VerifyConnection does the full
		// check against the Service name and the current roots instead.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, w.roots.Load(), name)
		},
	}
	c, _ := w.transports.LoadOrStore(name, &http.Client{Timeout: workerHTTP.Timeout, Transport: tr})
	return c.(*http.Client), nil
}

// verifyPeer checks the worker's certificate chain against roots for name.
func verifyPeer(cs tls.ConnectionState, roots *x509.CertPool, name string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the worker sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return fmt.Errorf("the worker's certificate is not trusted for %s: %w", name, err)
	}
	return nil
}

// API returns a client for the worker on node (with the operator's admin token).
func (w *Workers) API(ctx context.Context, media backupv1alpha1.Media, node string) (*instrumented, error) {
	token, err := w.Tokens.AdminToken(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's worker token: %w", err)
	}
	url := w.url(media, node)
	hc, err := w.httpFor(ctx, media, node)
	if err != nil {
		return nil, err
	}
	c, err := workerclient.New(url, token, hc)
	if err != nil {
		return nil, err
	}
	return &instrumented{c: c, at: w.callsTo(url)}, nil
}

// BackupProgress is what the worker a series is placed on (at) says of the backup of ns/name
// it is receiving or holding back until a slot is free; nil when the worker did not answer.
func (w *Workers) BackupProgress(ctx context.Context, at *backupv1alpha1.WorkerPlacement, ns, name string) *workerclient.BackupProgress {
	api, err := w.API(ctx, at.Media, at.Node)
	if err != nil {
		return nil
	}
	p, err := api.BackupProgress(ctx, ns, name)
	if err != nil {
		return nil
	}
	return p
}

// readBytes is how many bytes a running backup has read so far; ok is false when none runs or
// the worker did not answer (p nil).
func readBytes(p *workerclient.BackupProgress) (_ int64, ok bool) {
	if p == nil || !p.Running || p.LogicalBytes == nil {
		return 0, false
	}
	return *p.LogicalBytes, true
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
	url := w.url(media, node)
	hc, err := w.httpFor(ctx, media, node)
	if err != nil {
		return false, err
	}
	scoped, err := workerclient.New(url, tok, hc)
	if err != nil {
		return false, err
	}
	_, err = call(ctx, w.callsTo(url), "list_series", func(ctx context.Context) (*[]workerclient.Series, error) {
		return workerclient.JSON(scoped.ListSeriesWithResponse(ctx, &workerclient.ListSeriesParams{Namespace: &ns}))
	})
	switch {
	case err == nil:
		return true, nil
	case workerclient.IsUnauthorized(err):
		return false, nil
	default:
		return false, err
	}
}

// versionsAt lists a worker's versions of a series with their times (for plan.ResolveVersion).
func versionsAt(s *workerclient.SeriesDetail) []plan.VersionAt {
	vs := make([]plan.VersionAt, 0, len(s.VersionList))
	for _, v := range s.VersionList {
		vs = append(vs, plan.VersionAt{Number: v.Number, Time: v.Time})
	}
	return vs
}
