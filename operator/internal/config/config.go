// Package config is the operator's configuration file: the worker pools it runs and the
// settings of the backup and restore Jobs. The Helm chart renders it from its values into a
// ConfigMap mounted at /etc/revault-operator/config.yaml.
package config

import (
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
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
}

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
	DefaultPort         = 8420
	DefaultHostPath     = "/var/lib/revault"
	DefaultBackoffLimit = 3
	DefaultJobTTL       = 86400
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
	if len(errs) > 0 {
		return fmt.Errorf("operator config: %s", strings.Join(errs, "; "))
	}
	return nil
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
