package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackupSource says where a series' data comes from: exactly one of pvc or external.
// +kubebuilder:validation:XValidation:rule="has(self.pvc) != has(self.external)",message="exactly one of source.pvc or source.external must be set"
type BackupSource struct {
	// PVC backs up a PersistentVolumeClaim of the series' namespace. Backup Jobs mount it
	// read-only at /data and stream it to the series' worker with `revault push`.
	// +optional
	PVC *PVCSource `json:"pvc,omitempty"`

	// External series receive versions from a producer outside the operator (the Velero
	// integration, a database dump Job) that runs `revault push` with the namespace's token
	// Secret. The operator places the series and reports its versions but runs no backups.
	// +optional
	External *ExternalSource `json:"external,omitempty"`
}

// PVCSource names the PersistentVolumeClaim to back up.
type PVCSource struct {
	// ClaimName of a PersistentVolumeClaim in the series' namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ClaimName string `json:"claimName"`
}

// ExternalSource describes a series that an external producer pushes to.
type ExternalSource struct {
	// Producer is a free-form note on who pushes the versions (e.g. "velero").
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Producer string `json:"producer,omitempty"`
}

// StorageSpec selects the worker pool a series is placed in.
type StorageSpec struct {
	// Media of the worker pool: ssd or hdd (nodes labelled revault.io/storage=<media>).
	// +kubebuilder:default=ssd
	// +optional
	Media Media `json:"media,omitempty"`
}

// DedupUnit is what a series deduplicates: whole segments or single chunks.
// +kubebuilder:validation:Enum=segment;chunk
type DedupUnit string

const (
	DedupSegment DedupUnit = "segment"
	DedupChunk   DedupUnit = "chunk"
)

// DedupSpec holds the series' dedup settings.
type DedupSpec struct {
	// Unit is fixed when the series is created: segment (default) or chunk (the conventional
	// baseline).
	// +kubebuilder:default=segment
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="dedup.unit is fixed when the series is created"
	// +optional
	Unit DedupUnit `json:"unit,omitempty"`
}

// DeletionPolicy says what happens to a series' data on the worker when the BackupSeries is
// deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type DeletionPolicy string

const (
	DeletionRetain DeletionPolicy = "Retain"
	DeletionDelete DeletionPolicy = "Delete"
)

// BackupSeriesSpec defines a series of full backups of one source.
// +kubebuilder:validation:XValidation:rule="!has(self.source.external) || !has(self.schedule) || size(self.schedule) == 0",message="schedule applies to pvc sources only: external series are pushed by their producer"
// +kubebuilder:validation:XValidation:rule="!has(self.timeZone) || (has(self.schedule) && size(self.schedule) > 0)",message="timeZone applies to a schedule: set schedule too"
type BackupSeriesSpec struct {
	// Source of the data: exactly one of pvc or external.
	Source BackupSource `json:"source"`

	// Schedule is a cron schedule in the CronJob format: five space-separated fields
	// ("0 2 * * *") or one of @yearly, @monthly, @weekly, @daily, @midnight, @hourly.
	// Empty: only on-demand backups (annotation revault.io/backup-now).
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9*?/,A-Za-z-]+( +[0-9*?/,A-Za-z-]+){4})$')",message="schedule must be a cron schedule of five fields (e.g. \"0 2 * * *\") or @hourly/@daily/@weekly/@monthly/@yearly"
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// TimeZone is the IANA time zone (e.g. "Europe/Berlin") the schedule is read in (the
	// CronJob's spec.timeZone); unset means UTC. A name the operator does not know is reported in
	// the ScheduleValid condition and no CronJob runs.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$`
	// +optional
	TimeZone *string `json:"timeZone,omitempty"`

	// Suspend stops scheduled backups (on-demand backups still run).
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// Storage selects the worker pool. The series is pinned to one worker of that pool.
	// +kubebuilder:default={media: ssd}
	// +kubebuilder:validation:XValidation:rule="self.media == oldSelf.media",message="storage.media cannot change: the series' data lives on its worker"
	// +optional
	Storage StorageSpec `json:"storage"`

	// Dedup settings.
	// +kubebuilder:default={unit: segment}
	// +optional
	Dedup DedupSpec `json:"dedup"`

	// RetentionPolicyRef names a RetentionPolicy in the same namespace. Without one every
	// version is kept.
	// +optional
	RetentionPolicyRef *LocalObjectReference `json:"retentionPolicyRef,omitempty"`

	// DeletionPolicy: Retain (default) keeps the data on the worker when the BackupSeries is
	// deleted; Delete removes every version from the worker first.
	// +kubebuilder:default=Retain
	// +optional
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// WorkerPlacement is where a series lives.
type WorkerPlacement struct {
	// Media of the worker's pool.
	Media Media `json:"media"`
	// Node the worker (and the series' data) is on: the series' store is this node's store
	// wherever it is served from.
	Node string `json:"node"`
	// Host is the node the worker pod serving that store runs on: the node itself, or, after
	// the node was lost and its store rebuilt from the remote, another node of the pool.
	// +optional
	Host string `json:"host,omitempty"`
	// Pod is the worker pod currently serving that node (it changes when the pod restarts).
	// +optional
	Pod string `json:"pod,omitempty"`
	// Endpoint is the URL backup and restore Jobs use (the worker's per-node Service).
	Endpoint string `json:"endpoint"`
}

// VersionForm: live versions reference whole segments; archival ones were reverse-deduplicated.
type VersionForm string

// BackupVersion is one version of a series as the worker reports it.
type BackupVersion struct {
	// Number of the version (1, 2, ...; never reused).
	Number int64 `json:"number"`
	// Time the backup was taken.
	Time metav1.Time `json:"time"`
	// LogicalBytes is the size of the backed-up data.
	LogicalBytes int64 `json:"logicalBytes"`
	// NewBytes is the unique data this backup added (uncompressed).
	// +optional
	NewBytes int64 `json:"newBytes,omitempty"`
	// StoredBytes is what this backup wrote to containers (compressed).
	StoredBytes int64 `json:"storedBytes"`
	// Form: live or archival.
	// +optional
	Form VersionForm `json:"form,omitempty"`
}

// BackupSeriesPhase is a one-word summary of a series.
// +kubebuilder:validation:Enum=Pending;Ready;Queued;BackingUp;Moving;Failed;Deleting
type BackupSeriesPhase string

const (
	SeriesPending BackupSeriesPhase = "Pending"
	SeriesReady   BackupSeriesPhase = "Ready"
	// SeriesQueued: a backup Job runs, and its worker holds the backup back until one of its
	// backup slots (the worker's --max-backups) is free.
	SeriesQueued    BackupSeriesPhase = "Queued"
	SeriesBackingUp BackupSeriesPhase = "BackingUp"
	// SeriesMoving: the series is copied to another worker (revault.io/move-to, or its node
	// drained); backups wait until it is there.
	SeriesMoving   BackupSeriesPhase = "Moving"
	SeriesFailed   BackupSeriesPhase = "Failed"
	SeriesDeleting BackupSeriesPhase = "Deleting"
)

// JobRef records a finished backup Job.
type JobRef struct {
	// Name of the Job.
	Name string `json:"name"`
	// Succeeded is true when the Job completed successfully.
	Succeeded bool `json:"succeeded"`
	// CompletionTime of the Job.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Message from the Job's pod on failure (the worker's error).
	// +optional
	Message string `json:"message,omitempty"`
}

// BackupNowPhase is where an on-demand backup is.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed
type BackupNowPhase string

const (
	BackupNowRunning   BackupNowPhase = "Running"
	BackupNowSucceeded BackupNowPhase = "Succeeded"
	BackupNowFailed    BackupNowPhase = "Failed"
)

// BackupNowResult is what one value of the revault.io/backup-now annotation started and how it
// ended: producers such as the Velero plugin find the version their request made here.
type BackupNowResult struct {
	// Request is the annotation's value.
	Request string `json:"request"`
	// Job runs the backup.
	Job string `json:"job"`
	// Phase: Running, Succeeded or Failed.
	Phase BackupNowPhase `json:"phase"`
	// Version the backup committed (Succeeded).
	// +optional
	Version int64 `json:"version,omitempty"`
	// LogicalBytes the worker has read so far (Running) or backed up (Succeeded).
	// +optional
	LogicalBytes int64 `json:"logicalBytes,omitempty"`
	// StartTime is when the operator started the Job.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the Job finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Message says why the backup failed (the worker's error).
	// +optional
	Message string `json:"message,omitempty"`
}

// MaxBackupNowResults is how many on-demand backups status.backupNow keeps.
const MaxBackupNowResults = 10

// MaxStatusVersions is how many of the newest versions status.versions lists.
const MaxStatusVersions = 50

// BackupSeriesStatus is what the operator and the worker know about a series.
type BackupSeriesStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase: Pending (no worker yet), Ready, Queued (a backup waits for a slot on its worker),
	// BackingUp, Moving (copied to another worker), Failed (last backup failed), Deleting.
	// +optional
	Phase BackupSeriesPhase `json:"phase,omitempty"`

	// Worker the series is placed on.
	// +optional
	Worker *WorkerPlacement `json:"worker,omitempty"`

	// Versions are the newest versions (at most 50), oldest first.
	// +optional
	// +listType=atomic
	Versions []BackupVersion `json:"versions,omitempty"`

	// VersionCount is the number of versions on the worker.
	// +optional
	VersionCount int32 `json:"versionCount,omitempty"`

	// LatestVersion is the newest version's number.
	// +optional
	LatestVersion int64 `json:"latestVersion,omitempty"`

	// DurableVersion is the newest version the worker's remote (its S3 bucket) holds: a store
	// rebuilt from the bucket has every version up to it. Unset without a remote.
	// +optional
	DurableVersion int64 `json:"durableVersion,omitempty"`

	// LastBackup is the time of the newest version.
	// +optional
	LastBackup *metav1.Time `json:"lastBackup,omitempty"`

	// NextBackup is when the schedule runs the next backup; unset without a schedule, or while
	// suspended.
	// +optional
	NextBackup *metav1.Time `json:"nextBackup,omitempty"`

	// LogicalBytes of all versions together.
	// +optional
	LogicalBytes int64 `json:"logicalBytes,omitempty"`

	// StoredBytes all versions wrote to containers (compressed).
	// +optional
	StoredBytes int64 `json:"storedBytes,omitempty"`

	// DedupRatio is logicalBytes / storedBytes, e.g. "7.42".
	// +optional
	DedupRatio string `json:"dedupRatio,omitempty"`

	// LastBackupNow is the last value of the revault.io/backup-now annotation that started a Job.
	// +optional
	LastBackupNow string `json:"lastBackupNow,omitempty"`

	// LastJob is the newest finished backup Job.
	// +optional
	LastJob *JobRef `json:"lastJob,omitempty"`
	// BackupNow are the newest on-demand backups (at most 10), oldest first: the Job each
	// revault.io/backup-now value started, its progress, and the version it made.
	// +optional
	// +listType=atomic
	BackupNow []BackupNowResult `json:"backupNow,omitempty"`

	// Conditions: Ready, Placed, ScheduleValid, TokenReady, Synced, BackupSucceeded,
	// RetentionPolicyFound, DiskPressure, Durable with a remote, and BackupOverdue with an
	// active schedule.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BackupSeries is a series of full backups of one source, deduplicated on one worker.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=backupseries,singular=backupseries,shortName=bks,categories=revault
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Versions",type=integer,JSONPath=`.status.versionCount`
// +kubebuilder:printcolumn:name="Last Backup",type=date,JSONPath=`.status.lastBackup`
// +kubebuilder:printcolumn:name="Next Backup",type=date,JSONPath=`.status.nextBackup`,priority=1
// +kubebuilder:printcolumn:name="Dedup",type=string,JSONPath=`.status.dedupRatio`
// +kubebuilder:printcolumn:name="Media",type=string,JSONPath=`.spec.storage.media`,priority=1
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.worker.node`,priority=1
// +kubebuilder:printcolumn:name="Durable",type=integer,JSONPath=`.status.durableVersion`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupSeries struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupSeriesSpec   `json:"spec"`
	Status BackupSeriesStatus `json:"status,omitempty"`
}

// BackupSeriesList is a list of BackupSeries.
// +kubebuilder:object:root=true
type BackupSeriesList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupSeries `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BackupSeries{}, &BackupSeriesList{})
}
