// Package datamover holds the RBAC markers of the Velero data mover
// (internal/controller/datamover_*.go), and nothing else. `make manifests` generates them into a
// ClusterRole of their own (config/rbac/datamover/role.yaml, copied to the chart), which the Helm
// chart creates and binds only with velero.dataMover: an operator without the data mover cannot
// update PersistentVolumes, create, patch or delete PVCs, delete VolumeSnapshots, nor create or
// delete BackupSeries and RestoreJobs.
package datamover

// +kubebuilder:rbac:groups=velero.io,resources=datauploads;datadownloads,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;create;delete;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries;restorejobs,verbs=create;delete
// +kubebuilder:rbac:groups=velero.io,resources=restores,verbs=get
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots,verbs=get;delete
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=get;patch
