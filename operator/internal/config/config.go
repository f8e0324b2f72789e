// Package config is the operator's configuration file: the worker pools it runs and the
// settings of the backup and restore Jobs. The Helm chart renders it from its values into a
// ConfigMap mounted at /etc/revault-operator/config.yaml.
package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// Config is the operator configuration.
type Config struct {
	// Namespace the workers, their Services and the worker token Secret live in (the operator's
	// own namespace). Filled from --namespace / POD_NAMESPACE when empty.
	Namespace string `json:"namespace,omitempty"`
	// Worker settings shared by every pool.
	Worker WorkerConfig `json:"worker"`
	// Pools: one DaemonSet per entry, on nodes labelled revault.io/storage=<media>.
	Pools []PoolConfig `json:"pools"`
	// Jobs: backup and restore Jobs.
	Jobs JobConfig `json:"jobs"`
	// Remote, when set, gives every worker's store an encrypted copy in an S3 bucket and
	// lets the operator rebuild the store of a lost node on another node (docs/remote.md).
	Remote *RemoteConfig `json:"remote,omitempty"`
	// TLS, when set, makes workers serve HTTPS with a certificate the operator issues (or one
	// given in a Secret) and every client verify it; nil: plain HTTP.
	TLS *TLSConfig `json:"tls,omitempty"`
}

// TLSConfig is how workers get their certificate (docs/operator.md, "TLS").
type TLSConfig struct {
	// Secret, when set, is a Secret in the operator namespace with tls.crt, tls.key and ca.crt
	// (a cert-manager Certificate's) that the workers serve; its names must cover
	// *.<namespace>.svc. Empty: the operator's own CA issues and renews the certificate.
	Secret string `json:"secret,omitempty"`
	// CertValidity of the certificate the operator issues; renewed when a third is left.
	CertValidity metav1.Duration `json:"certValidity,omitempty"`
	// CAValidity of the operator's CA; renewed when a third is left.
	CAValidity metav1.Duration `json:"caValidity,omitempty"`
	// ClusterDomain is added to the certificate's names (*.<namespace>.svc.<clusterDomain>).
	ClusterDomain string `json:"clusterDomain,omitempty"`
}

// TLS defaults: a serving certificate for 90 days, a CA for 10 years.
const (
	DefaultCertValidity  = 90 * 24 * time.Hour
	DefaultCAValidity    = 10 * 365 * 24 * time.Hour
	DefaultClusterDomain = "cluster.local"
	// minCertValidity keeps renewals (at two thirds of the life) slower than the kubelet's
	// Secret updates reach pods (about a minute).
	minCertValidity = 10 * time.Minute
	// MinCAValidity: a CA is renewed when a third of its life is left, and its successor only
	// signs a day after (certs.PublishDelay). Both the old CA's last third and the new CA's
	// first two thirds must outlast that day, or rotations overlap and a CA signs before
	// clients know it: three days at least, and a fourth so that a rotation made late (the
	// operator down for up to 8 hours when it was due) still keeps the day.
	MinCAValidity = 4 * 24 * time.Hour
)

// TLSOn reports whether workers serve HTTPS.
func (c *Config) TLSOn() bool { return c.TLS != nil }

// RemoteConfig is the durable tier: where the stores' copies go and how workers reach it.
type RemoteConfig struct {
	// URL is s3://BUCKET[/PREFIX]; the store of pool <media> on node <node> lives under
	// <URL>/<media>/<node>.
	URL string `json:"url"`
	// Endpoint of an S3-compatible store (AWS_ENDPOINT_URL); empty for AWS S3.
	Endpoint string `json:"endpoint,omitempty"`
	// Region (AWS_REGION); empty: the SDK's default (us-east-1 for other stores).
	Region string `json:"region,omitempty"`
	// CredentialsSecret (operator namespace) holds AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY; empty when workers get credentials otherwise (IRSA, instance
	// roles).
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
	// KeySecret (operator namespace) holds the key file under key "key": whoever has it and
	// the bucket can read every backup, and without it nobody can. Keep a copy outside the
	// cluster.
	KeySecret string `json:"keySecret"`
	// SyncInterval: workers upload at most this often (`revault serve --sync-interval`).
	SyncInterval metav1.Duration `json:"syncInterval,omitempty"`
	// EvictAfter: containers no live version reads leave local disk this long after they are
	// written (0: everything stays local).
	EvictAfter metav1.Duration `json:"evictAfter,omitempty"`
	// ObjectLockDays writes every object with S3 Object Lock for this many days (0: off).
	ObjectLockDays int32 `json:"objectLockDays,omitempty"`
	// LostNodeTimeout: a node NotReady this long has lost its store, which is rebuilt from
	// the bucket on another node of its pool (a deleted node at once).
	LostNodeTimeout metav1.Duration `json:"lostNodeTimeout,omitempty"`
	// BehindAfter: a series whose newest version is older than this and not in the bucket
	// gets Durable=False (reason RemoteBehind).
	BehindAfter metav1.Duration `json:"behindAfter,omitempty"`
}

// RemoteKeyFile is the key Secret's key, and where workers mount the key file.
const (
	RemoteKeySecretKey = "key"
)

// WorkerConfig describes the `revault serve` pods.
type WorkerConfig struct {
	// Image with the revault binary on PATH (also used by the Jobs unless jobs.image is set).
	Image           string            `json:"image"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Command runs the revault binary in the image (default ["revault"], found on PATH); the
	// worker and the Jobs append their subcommand and flags as args.
	Command []string `json:"command,omitempty"`
	// Port the worker listens on (and its Services expose).
	Port int32 `json:"port,omitempty"`
	// HostPath is the directory on each node holding the store; each pool uses
	// <hostPath>/<media> so a node in two pools keeps two stores.
	HostPath string `json:"hostPath,omitempty"`
	// LogFormat passed to `revault serve --log-format` when set (text or json).
	LogFormat string `json:"logFormat,omitempty"`
	// DedupDomain passed to `revault serve --dedup-domain` when set: store (backups dedup
	// against everything on the worker) or namespace (only within their namespace).
	DedupDomain string `json:"dedupDomain,omitempty"`
	// PriorityClassName for worker pods.
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ImagePullSecrets for worker pods.
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Env is set in the worker container, e.g. REVAULT_LOG (the log filter) or
	// MIMALLOC_PURGE_DELAY (how long freed memory stays mapped for reuse; docs/service.md).
	Env []corev1.EnvVar `json:"env,omitempty"`
}

// PoolConfig is one worker pool.
type PoolConfig struct {
	Media       backupv1alpha1.Media        `json:"media"`
	Resources   corev1.ResourceRequirements `json:"resources,omitempty"`
	Tolerations []corev1.Toleration         `json:"tolerations,omitempty"`
	// NodeSelector is added to revault.io/storage=<media>.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// JobConfig describes backup and restore Jobs.
type JobConfig struct {
	// Image for the Jobs; defaults to worker.image.
	Image           string                      `json:"image,omitempty"`
	ImagePullPolicy corev1.PullPolicy           `json:"imagePullPolicy,omitempty"`
	Resources       corev1.ResourceRequirements `json:"resources,omitempty"`
	// BackoffLimit is how often a failed backup or restore pod is retried.
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`
	// TTLSecondsAfterFinished removes finished on-demand backup Jobs (CronJob Jobs follow
	// the CronJob's history limits; restore Jobs live as long as their RestoreJob).
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// ActiveDeadlineSeconds bounds one backup or restore (0: no bound).
	ActiveDeadlineSeconds int64 `json:"activeDeadlineSeconds,omitempty"`
	// PriorityClassName for Job pods.
	PriorityClassName string                        `json:"priorityClassName,omitempty"`
	ImagePullSecrets  []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
}

// Defaults used when the file leaves a field out.
const (
	DefaultPort            = 8420
	DefaultHostPath        = "/var/lib/revault"
	DefaultBackoffLimit    = 3
	DefaultJobTTL          = 86400
	DefaultSyncInterval    = 5 * time.Second
	DefaultLostNodeTimeout = 10 * time.Minute
	DefaultBehindAfter     = 30 * time.Minute
)

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading operator config: %w", err)
	}
	return Parse(b)
}

// Parse parses, defaults and validates a configuration.
func Parse(b []byte) (*Config, error) {
	c := &Config{}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, fmt.Errorf("operator config: %w", err)
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Default fills unset fields.
func (c *Config) Default() {
	if c.Worker.Port == 0 {
		c.Worker.Port = DefaultPort
	}
	if c.Worker.HostPath == "" {
		c.Worker.HostPath = DefaultHostPath
	}
	if len(c.Worker.Command) == 0 {
		c.Worker.Command = []string{"revault"}
	}
	if c.Worker.ImagePullPolicy == "" {
		c.Worker.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if c.Jobs.Image == "" {
		c.Jobs.Image = c.Worker.Image
	}
	if c.Jobs.ImagePullPolicy == "" {
		c.Jobs.ImagePullPolicy = c.Worker.ImagePullPolicy
	}
	if len(c.Jobs.ImagePullSecrets) == 0 {
		c.Jobs.ImagePullSecrets = c.Worker.ImagePullSecrets
	}
	if c.Jobs.BackoffLimit == nil {
		v := int32(DefaultBackoffLimit)
		c.Jobs.BackoffLimit = &v
	}
	if c.Jobs.TTLSecondsAfterFinished == nil {
		v := int32(DefaultJobTTL)
		c.Jobs.TTLSecondsAfterFinished = &v
	}
	if t := c.TLS; t != nil {
		if t.CertValidity.Duration == 0 {
			t.CertValidity.Duration = DefaultCertValidity
		}
		if t.CAValidity.Duration == 0 {
			t.CAValidity.Duration = DefaultCAValidity
		}
		if t.ClusterDomain == "" {
			t.ClusterDomain = DefaultClusterDomain
		}
	}
	if r := c.Remote; r != nil {
		if r.SyncInterval.Duration == 0 {
			r.SyncInterval.Duration = DefaultSyncInterval
		}
		if r.LostNodeTimeout.Duration == 0 {
			r.LostNodeTimeout.Duration = DefaultLostNodeTimeout
		}
		if r.BehindAfter.Duration == 0 {
			r.BehindAfter.Duration = DefaultBehindAfter
		}
	}
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []string
	if c.Worker.Image == "" {
		errs = append(errs, "worker.image is required")
	}
	if c.Worker.Port < 1 || c.Worker.Port > 65535 {
		errs = append(errs, fmt.Sprintf("worker.port %d is not a port", c.Worker.Port))
	}
	if !strings.HasPrefix(c.Worker.HostPath, "/") {
		errs = append(errs, fmt.Sprintf("worker.hostPath %q must be absolute", c.Worker.HostPath))
	}
	switch c.Worker.LogFormat {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Sprintf("worker.logFormat %q must be text or json", c.Worker.LogFormat))
	}
	switch c.Worker.DedupDomain {
	case "", "store", "namespace":
	default:
		errs = append(errs, fmt.Sprintf("worker.dedupDomain %q must be store or namespace", c.Worker.DedupDomain))
	}
	for i, e := range c.Worker.Env {
		for _, m := range validation.IsEnvVarName(e.Name) {
			errs = append(errs, fmt.Sprintf("worker.env[%d].name %q: %s", i, e.Name, m))
		}
	}
	if c.Namespace != "" {
		for _, m := range validation.IsDNS1123Label(c.Namespace) {
			errs = append(errs, "namespace: "+m)
		}
	}
	seen := map[backupv1alpha1.Media]bool{}
	for i, p := range c.Pools {
		switch p.Media {
		case backupv1alpha1.MediaSSD, backupv1alpha1.MediaHDD:
		default:
			errs = append(errs, fmt.Sprintf("pools[%d].media %q must be ssd or hdd", i, p.Media))
		}
		if seen[p.Media] {
			errs = append(errs, fmt.Sprintf("pools[%d]: media %q appears twice", i, p.Media))
		}
		seen[p.Media] = true
	}
	if len(c.Pools) == 0 {
		errs = append(errs, "pools: at least one pool (ssd or hdd) is required")
	}
	if *c.Jobs.BackoffLimit < 0 {
		errs = append(errs, "jobs.backoffLimit must not be negative")
	}
	if c.Jobs.ActiveDeadlineSeconds < 0 {
		errs = append(errs, "jobs.activeDeadlineSeconds must not be negative")
	}
	errs = append(errs, c.Remote.problems()...)
	errs = append(errs, c.TLS.problems()...)
	if len(errs) > 0 {
		return fmt.Errorf("operator config: %s", strings.Join(errs, "; "))
	}
	return nil
}

// s3URL is what `revault --remote` takes: s3://BUCKET or s3://BUCKET/PREFIX.
var s3URL = regexp.MustCompile(`^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/].*)?$`)

func (r *RemoteConfig) problems() []string {
	if r == nil {
		return nil
	}
	var errs []string
	if !s3URL.MatchString(r.URL) || strings.HasSuffix(r.URL, "/") {
		errs = append(errs, fmt.Sprintf("remote.url %q must be s3://BUCKET or s3://BUCKET/PREFIX", r.URL))
	}
	if r.Endpoint != "" && !strings.HasPrefix(r.Endpoint, "http://") && !strings.HasPrefix(r.Endpoint, "https://") {
		errs = append(errs, fmt.Sprintf("remote.endpoint %q must be an http:// or https:// URL", r.Endpoint))
	}
	for _, s := range []struct{ field, name string }{{"remote.keySecret", r.KeySecret}, {"remote.credentialsSecret", r.CredentialsSecret}} {
		if s.name == "" && s.field == "remote.credentialsSecret" {
			continue
		}
		for _, m := range validation.IsDNS1123Subdomain(s.name) {
			errs = append(errs, fmt.Sprintf("%s %q: %s", s.field, s.name, m))
		}
	}
	if r.ObjectLockDays < 0 {
		errs = append(errs, "remote.objectLockDays must not be negative")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"remote.syncInterval", r.SyncInterval.Duration}, {"remote.evictAfter", r.EvictAfter.Duration}, {"remote.lostNodeTimeout", r.LostNodeTimeout.Duration}, {"remote.behindAfter", r.BehindAfter.Duration}} {
		if d.v < 0 {
			errs = append(errs, d.field+" must not be negative")
		}
	}
	return errs
}

func (t *TLSConfig) problems() []string {
	if t == nil {
		return nil
	}
	var errs []string
	if t.Secret != "" {
		for _, m := range validation.IsDNS1123Subdomain(t.Secret) {
			errs = append(errs, fmt.Sprintf("tls.secret %q: %s", t.Secret, m))
		}
	}
	if t.CertValidity.Duration < minCertValidity {
		errs = append(errs, fmt.Sprintf("tls.certValidity %s must be at least %s", t.CertValidity.Duration, minCertValidity))
	}
	if t.CAValidity.Duration < MinCAValidity {
		errs = append(errs, fmt.Sprintf("tls.caValidity %s must be at least %s (a new CA is published a day before it signs, with a margin for a late rotation)", t.CAValidity.Duration, MinCAValidity))
	}
	if t.CAValidity.Duration < 2*t.CertValidity.Duration {
		errs = append(errs, fmt.Sprintf("tls.caValidity %s must be at least twice tls.certValidity (%s)", t.CAValidity.Duration, t.CertValidity.Duration))
	}
	for _, m := range validation.IsDNS1123Subdomain(t.ClusterDomain) {
		errs = append(errs, fmt.Sprintf("tls.clusterDomain %q: %s", t.ClusterDomain, m))
	}
	return errs
}

// StoreURL is the remote of the store of pool media on node: <url>/<media>/<node>.
func (r *RemoteConfig) StoreURL(media, node string) string {
	return r.URL + "/" + media + "/" + node
}

// Pool returns the pool of the given media.
func (c *Config) Pool(m backupv1alpha1.Media) (PoolConfig, bool) {
	for _, p := range c.Pools {
		if p.Media == m {
			return p, true
		}
	}
	return PoolConfig{}, false
}
