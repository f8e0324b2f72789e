// Package kube gives the plugin its Kubernetes client (in the Velero pod: Velero's service
// account; outside a cluster: $KUBECONFIG) and the shared names of the Velero integration.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// Labels and annotations of the Velero integration.
const (
	// Select marks a PVC whose data the BackupItemAction backs up into Revault: the label or
	// the annotation revault.io/velero: "true".
	Select = "revault.io/velero"
	// Media (annotation on the PVC) picks the worker pool of a series the plugin creates.
	Media = "revault.io/media"
	// On the backed-up copy of a selected PVC: its series, the backup-now request that backs
	// it up in this Velero backup, and the media of a series the restore has to create.
	AnnSeries  = "revault.io/velero-series"
	AnnRequest = "revault.io/velero-request"
	AnnMedia   = "revault.io/velero-media"
	// On the backed-up copy of that series' BackupSeries (written when the Velero backup
	// finalizes): the request, the version it made, the PVC and the worker holding it.
	AnnVersion = "revault.io/velero-version"
	AnnPVC     = "revault.io/velero-pvc"
	AnnWorker  = "revault.io/velero-worker"
	// AnnData on the backed-up copy of a PV: NAMESPACE/PVC, the claim whose data Revault holds
	// (such a PV is not restored; its claim gets a new volume).
	AnnData = "revault.io/velero-data"
	// LabelRestore marks RestoreJobs with the Velero restore that created them, LabelPVC with
	// their PVC (label values).
	LabelRestore = "revault.io/velero-restore"
	LabelPVC     = "revault.io/velero-pvc"
	// SchedulingGate holds restored pods until their PVCs' data is back.
	SchedulingGate = "revault.io/restore"
	// ManagedBy is the managed-by label value of objects the plugin creates.
	ManagedBy = "revault-velero-plugin"
	// TokenSecret is the Secret (key "token") the operator gives each namespace with series.
	TokenSecret = "revault-token"
	TokenKey    = "token"
)

var (
	mu     sync.Mutex
	shared client.Client
)

// Use makes c the process's client (tests point the actions at their API server).
func Use(c client.Client) {
	mu.Lock()
	defer mu.Unlock()
	shared = c
}

// Scheme knows the built-in types (core and batch among them) and backup.revault.io types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = backupv1alpha1.AddToScheme(s)
	return s
}

// Client returns the process's Kubernetes client, made on first use from the in-cluster
// configuration or $KUBECONFIG.
func Client() (client.Client, error) {
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		return shared, nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	shared = c
	return c, nil
}

// Token reads a namespace's Revault token from the Secret ns/name (key TokenKey, trimmed; ""
// when the Secret has none).
func Token(ctx context.Context, c client.Client, ns, name string) (string, error) {
	sec := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, sec); err != nil {
		return "", err
	}
	return strings.TrimSpace(string(sec.Data[TokenKey])), nil
}

// CAConfigMap is the ConfigMap (key CAKey) where the operator gives each namespace with series
// the CA bundle of the workers' TLS certificate.
const (
	CAConfigMap = "revault-ca"
	CAKey       = "ca.crt"
)

// CABundle reads namespace ns's CA bundle; nil when the namespace has none (workers without
// TLS, or with a certificate from a public CA).
func CABundle(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	cm := &corev1.ConfigMap{}
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: CAConfigMap}, cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []byte(cm.Data[CAKey]), nil
}

// Namespace is Velero's namespace: $VELERO_NAMESPACE (set in Velero's pod), the service
// account's namespace, or "velero".
func Namespace() string {
	if ns := os.Getenv("VELERO_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "velero"
}

// LabelValue maps a name to a valid label value (≤63 characters): the name when it is one,
// else a prefix and a digest.
func LabelValue(s string) string {
	ok := len(s) <= 63
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
	}
	if ok && (s == "" || isAlnum(s[0]) && isAlnum(s[len(s)-1])) {
		return s
	}
	return FitName(s, 63)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// FitName shortens name to max characters of lowercase letters, digits and '-', keeping it
// unique with a digest of the full name when it had to change.
func FitName(name string, max int) string {
	clean := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-':
			clean = append(clean, c)
		case c >= 'A' && c <= 'Z':
			clean = append(clean, c+'a'-'A')
		default:
			clean = append(clean, '-')
		}
	}
	s := strings.Trim(string(clean), "-")
	if s == name && len(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:4])
	if keep := max - len(h) - 1; len(s) > keep {
		s = strings.TrimRight(s[:keep], "-")
	}
	if s == "" {
		return h
	}
	return s + "-" + h
}
