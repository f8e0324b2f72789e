package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CachePolicy is the restore cache the worker uses to read containers.
// +kubebuilder:validation:Enum=auto;opt;faa;lru-container;lru-chunk;dasm
type CachePolicy string

// RestoreCacheSpec is the restore cache and its memory budget.
type RestoreCacheSpec struct {
	// Policy: auto (default: faa or opt, whichever the worker counts fewer container reads
	// for on the version's recipe), opt (Belady container cache over the known recipe),
	// faa (forward assembly area), lru-container, lru-chunk, or dasm.
	// +kubebuilder:default=auto
	// +optional
	Policy CachePolicy `json:"policy,omitempty"`

	// MemoryBudget of the restore cache on the worker, between 1Mi and 16Gi (rounded up to
	// whole MiB). Default 64Mi.
	// +kubebuilder:default="64Mi"
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('16Gi')) <= 0",message="cache.memoryBudget must be between 1Mi and 16Gi"
	// +optional
	MemoryBudget *resource.Quantity `json:"memoryBudget,omitempty"`
}

// PVCTarget names the PersistentVolumeClaim a restore writes into.
type PVCTarget struct {
	// ClaimName of a PersistentVolumeClaim in the RestoreJob's namespace. The restore Job
	// mounts it read-write at /data and restores the version into its root.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ClaimName string `json:"claimName"`
}

// RestoreJobSpec says which version of which series goes where. It cannot change once created.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a RestoreJob's spec cannot change; create a new RestoreJob"
type RestoreJobSpec struct {
	// SeriesRef names the BackupSeries (same namespace) to restore from.
	SeriesRef LocalObjectReference `json:"seriesRef"`

	// Version to restore: a number ("3"), "latest", or an RFC 3339 time
	// ("2025-06-01T00:00:00Z": the newest version taken at or before it).
	// +kubebuilder:default=latest
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self == 'latest' || self.matches('^[1-9][0-9]{0,9}$') || self.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$')",message="version must be a version number, \"latest\", or an RFC 3339 time such as \"2025-06-01T00:00:00Z\""
	// +optional
	Version string `json:"version,omitempty"`

	// TargetPVC receives the restored data.
	TargetPVC PVCTarget `json:"targetPVC"`

	// Cache is the restore cache policy and memory budget.
	// +kubebuilder:default={policy: auto, memoryBudget: "64Mi"}
	// +optional
	Cache RestoreCacheSpec `json:"cache"`
}

// RestorePhase is where a RestoreJob is.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type RestorePhase string

const (
	RestorePending   RestorePhase = "Pending"
	RestoreRunning   RestorePhase = "Running"
	RestoreSucceeded RestorePhase = "Succeeded"
	RestoreFailed    RestorePhase = "Failed"
)

// RestoreJobStatus reports a restore's progress and result.
type RestoreJobStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase: Pending, Running, Succeeded or Failed.
	// +optional
	Phase RestorePhase `json:"phase,omitempty"`

	// ResolvedVersion is the version number being restored ("latest" and times resolve once,
	// when the restore starts, so a retried pod restores the same version).
	// +optional
	ResolvedVersion int64 `json:"resolvedVersion,omitempty"`

	// Worker is the node of the worker the data comes from.
	// +optional
	Worker string `json:"worker,omitempty"`

	// JobName is the Job that runs `revault pull`.
	// +optional
	JobName string `json:"jobName,omitempty"`

	// StartTime is when the restore Job was created.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// CompletionTime is when the restore finished (either way).
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// Progress in percent of the version's bytes, e.g. "100%". The pull reports once, at the
	// end, so it is 0% while the Job runs.
	// +optional
	Progress string `json:"progress,omitempty"`

	// TotalBytes is the logical size of the version.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`

	// RestoredBytes is what the restore wrote.
	// +optional
	RestoredBytes int64 `json:"restoredBytes,omitempty"`

	// Throughput of the restore, e.g. "412.3 MiB/s".
	// +optional
	Throughput string `json:"throughput,omitempty"`

	// ThroughputBytesPerSecond is the same figure as an integer.
	// +optional
	ThroughputBytesPerSecond int64 `json:"throughputBytesPerSecond,omitempty"`

	// SpeedFactor is MiB restored per container read (higher is better), e.g. "3.91".
	// +optional
	SpeedFactor string `json:"speedFactor,omitempty"`

	// ContainerReads the restore made.
	// +optional
	ContainerReads int64 `json:"containerReads,omitempty"`

	// Conditions: Complete, Failed. A failure's message carries the worker's error.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RestoreJob restores one version of a BackupSeries into a PersistentVolumeClaim.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rsj,categories=revault
// +kubebuilder:printcolumn:name="Series",type=string,JSONPath=`.spec.seriesRef.name`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.status.resolvedVersion`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Throughput",type=string,JSONPath=`.status.throughput`
// +kubebuilder:printcolumn:name="Speed Factor",type=string,JSONPath=`.status.speedFactor`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RestoreJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RestoreJobSpec   `json:"spec"`
	Status RestoreJobStatus `json:"status,omitempty"`
}

// RestoreJobList is a list of RestoreJob.
// +kubebuilder:object:root=true
type RestoreJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RestoreJob `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RestoreJob{}, &RestoreJobList{})
}
