package v1alpha1

// Well-known labels, annotations and finalizers of the backup.revault.io API.
const (
	// BackupNowAnnotation on a BackupSeries asks for a one-off backup. Every new value
	// (a timestamp is a good choice) starts one Job; the operator acknowledges the value in
	// status.lastBackupNow instead of removing the annotation, so GitOps tools see no drift.
	BackupNowAnnotation = "revault.io/backup-now"

	// QuotaAnnotation, on a Namespace, limits what its series may store: a quantity of bytes
	// ("500Gi"), charged as the sum of their versions' storedBytes. A namespace at or over it
	// takes no new backup (the operator suspends its schedules and the workers refuse uploads)
	// until versions expire or the quota is raised.
	QuotaAnnotation = "revault.io/quota"

	// PlacementAnnotation records, as MEDIA/NODE, the worker a BackupSeries was placed on. The
	// operator writes it when it places the series and follows it when status.worker is gone
	// (a BackupSeries restored without its status, e.g. by Velero): the series goes back to
	// the store that holds its data, even while that worker is down, instead of starting a
	// second history elsewhere.
	PlacementAnnotation = "revault.io/placement"

	// StorageLabel marks the nodes that run workers: revault.io/storage=ssd or =hdd.
	StorageLabel = "revault.io/storage"

	// MoveToAnnotation on a BackupSeries asks the operator to move the series, its whole
	// history, to the worker of its media on the node it names, or to the one with the most
	// room with the value "any". The operator removes it once the series is moved.
	MoveToAnnotation = "revault.io/move-to"

	// DrainAnnotation on a Node ("true") drains the node's workers: they take no new series,
	// and every series placed on them is moved to another worker of its media.
	DrainAnnotation = "revault.io/drain"

	// MovingAnnotation, written by the operator, records a move under way as MEDIA/NODE (the
	// destination) before its Job starts, so a lost status never starts a second copy elsewhere.
	MovingAnnotation = "revault.io/moving-to"

	// MovedFromAnnotation, written by the operator in the same write that moves the placement,
	// names (MEDIA/NODE) the worker whose copy of a moved series is still to be deleted.
	MovedFromAnnotation = "revault.io/moved-from"

	// SeriesFinalizer lets the operator honour spec.deletionPolicy before a BackupSeries goes.
	SeriesFinalizer = "backup.revault.io/series-data"
)

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// Media is the kind of disk a worker pool stores data on.
// +kubebuilder:validation:Enum=ssd;hdd
type Media string

const (
	MediaSSD Media = "ssd"
	MediaHDD Media = "hdd"
)

// Condition types and reasons shared by the kinds.
const (
	// ConditionReady summarises a BackupSeries: placed, reachable, last backup fine.
	ConditionReady = "Ready"
	// ConditionPlaced: the series has a worker (its dedup domain).
	ConditionPlaced = "Placed"
	// ConditionScheduleValid: spec.schedule parses as a cron schedule.
	ConditionScheduleValid = "ScheduleValid"
	// ConditionTokenReady: the series' worker accepts the namespace's token (on-demand backup
	// Jobs and restore Jobs wait for it).
	ConditionTokenReady = "TokenReady"
	// ConditionSynced: status was read back from the worker on the last reconcile.
	ConditionSynced = "Synced"
	// ConditionBackupSucceeded: the newest finished backup Job succeeded.
	ConditionBackupSucceeded = "BackupSucceeded"
	// ConditionDurable: the worker's remote holds the series' newest version (only with a
	// remote; False, reason RemoteBehind, once the newest version is older than the remote's
	// behindAfter and still not uploaded).
	ConditionDurable = "Durable"
	// ConditionBackupOverdue: True when a scheduled series has no new backup although two
	// scheduled runs have passed since its newest version (plan.BackupDeadline); present only
	// while a valid schedule is active (not suspended).
	ConditionBackupOverdue = "BackupOverdue"
	// ConditionDiskPressure: True while the series' worker has less than the operator's
	// --min-free-percent free on its containers' or metadata's filesystem: it takes no new
	// series, and this one's backups fail once the disk is full. Absent until the worker reports
	// its room.
	ConditionDiskPressure = "DiskPressure"
	// ConditionQuotaExceeded: True while the series' namespace stores at least its quota
	// (QuotaAnnotation): its scheduled backups are suspended and backup-now requests fail.
	// Absent when the namespace has no quota.
	ConditionQuotaExceeded = "QuotaExceeded"
	// ConditionMoving: the series is being moved to another worker (True), or its last move
	// failed or cannot start (False).
	ConditionMoving = "Moving"
	// ConditionRetentionPolicyFound: spec.retentionPolicyRef names an existing policy.
	ConditionRetentionPolicyFound = "RetentionPolicyFound"
	// ConditionApplied: a RetentionPolicy reached the worker of every series using it.
	ConditionApplied = "Applied"
	// ConditionScheduled: a RetentionPolicy's expirySchedule is valid and planned.
	ConditionScheduled = "Scheduled"
	// ConditionComplete / ConditionFailed: a RestoreJob finished (one of them is True at the end).
	ConditionComplete = "Complete"
	ConditionFailed   = "Failed"
)
