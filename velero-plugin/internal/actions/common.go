// Package actions holds the plugin's item actions: the BackupItemAction that backs a PVC's data
// up into a Revault series (a BackupSeries on-demand backup run by the operator), the
// RestoreItemActions that restore it before workloads start (a RestoreJob, with pods held by a
// scheduling gate) and keep the operator's own objects out of restores, and the
// DeleteItemAction that expires the version when the Velero backup is deleted.
package actions

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
)

// apiTimeout bounds each action's calls to the Kubernetes API and workers.
const apiTimeout = 60 * time.Second

func apiCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), apiTimeout)
}

func toPVC(item runtime.Unstructured) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.UnstructuredContent(), pvc); err != nil {
		return nil, fmt.Errorf("reading the PVC item: %w", err)
	}
	return pvc, nil
}

// selected reports whether a PVC asks for Revault: label or annotation revault.io/velero=true.
func selected(obj interface {
	GetLabels() map[string]string
	GetAnnotations() map[string]string
}) bool {
	return obj.GetLabels()[kube.Select] == "true" || obj.GetAnnotations()[kube.Select] == "true"
}

// annotated returns item with the annotations kv added (or replaced).
func annotated(item runtime.Unstructured, kv map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: item.UnstructuredContent()}
	ann := u.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	maps.Copy(ann, kv)
	u.SetAnnotations(ann)
	return u
}

// recordedVersion is the Revault version a backed-up BackupSeries records in its annotations
// (recorded false when it records none).
func recordedVersion(u *unstructured.Unstructured) (version int64, recorded bool, _ error) {
	v := u.GetAnnotations()[kube.AnnVersion]
	if v == "" {
		return 0, false, nil
	}
	version, err := strconv.ParseInt(v, 10, 64)
	if err != nil || version < 1 {
		return 0, false, fmt.Errorf("BackupSeries %s/%s: annotation %s=%q is not a version number", u.GetNamespace(), u.GetName(), kube.AnnVersion, v)
	}
	return version, true, nil
}

// workerClient reaches the worker of a series in namespace ns with that namespace's token (the
// Secret the operator gives every namespace with series). hint is the endpoint recorded at
// backup time, used when the BackupSeries is gone.
func workerClient(ctx context.Context, c client.Client, ns, series, hint string) (*workerclient.ClientWithResponses, error) {
	endpoint, recorded := hint, true
	bs := &backupv1alpha1.BackupSeries{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: series}, bs); err == nil &&
		bs.Status.Worker != nil && bs.Status.Worker.Endpoint != "" {
		endpoint, recorded = bs.Status.Worker.Endpoint, false
	}
	if endpoint == "" {
		return nil, fmt.Errorf("no worker known for series %s/%s (no BackupSeries and no endpoint recorded at backup time)", ns, series)
	}
	token, err := kube.Token(ctx, c, ns, kube.TokenSecret)
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s (the namespace's Revault token): %w", ns, kube.TokenSecret, err)
	}
	// A worker with the operator's certificate is verified with the bundle the operator keeps
	// in the namespace (none: plain HTTP, or a public CA).
	ca, err := kube.CABundle(ctx, c, ns)
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s (the workers' CA bundle): %w", ns, kube.CAConfigMap, err)
	}
	if recorded {
		endpoint = upgradeScheme(endpoint, ca)
	}
	// An expiry may take a while on a large store: no overall timeout but the caller's context.
	hc, err := workerclient.StreamingHTTPClient(workerclient.TLSOptions{CACert: ca})
	if err != nil {
		return nil, err
	}
	return workerclient.New(endpoint, token, hc)
}

// upgradeScheme turns an http:// endpoint recorded at backup time into https:// when the
// namespace has the workers' CA bundle: recorded before TLS was turned on, it names a worker
// that now serves HTTPS only, and without this its versions would never be expired. A live
// series' endpoint is the operator's word and is used as it is (the bundle stays in a namespace
// after TLS is turned off).
func upgradeScheme(endpoint string, bundle []byte) string {
	if rest, ok := strings.CutPrefix(endpoint, "http://"); ok && len(bundle) > 0 {
		return "https://" + rest
	}
	return endpoint
}

// splitID splits an operation ID into n parts separated by '/'.
func splitID(id string, n int) ([]string, error) {
	parts := strings.SplitN(id, "/", n)
	if len(parts) != n {
		return nil, fmt.Errorf("operation ID %q is invalid", id)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("operation ID %q is invalid", id)
		}
	}
	return parts, nil
}
