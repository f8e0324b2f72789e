package plan

import (
	"fmt"
	"strconv"
	"strings"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
)

// The Velero data mover: DataUpload and DataDownload objects whose spec.datamover is "revault".
const (
	// DataMoverName is the value of spec.datamover the operator handles
	// (`velero backup create --snapshot-move-data --data-mover revault`).
	DataMoverName = "revault"
	// ComponentDataMover marks the PVCs the data mover creates (snapshot and restore volumes).
	ComponentDataMover = "datamover"
	// LabelDataMover marks the data mover's Jobs, PVCs, RestoreJobs and BackupSeries with the
	// DataUpload or DataDownload they serve (as a label value).
	LabelDataMover = "revault.io/velero-datamover"
	// AnnotationDataMover holds "KIND NAMESPACE/NAME" of that DataUpload or DataDownload.
	AnnotationDataMover = "revault.io/velero-datamover"
	// AnnotationRestorePV on a DataDownload names the volume it restored into, so the rebinding
	// survives the restore PVC's deletion.
	AnnotationRestorePV = "revault.io/restore-pv"
	// AnnotationReclaimPolicy on a restore PV keeps its reclaim policy while the data mover
	// holds it at Retain.
	AnnotationReclaimPolicy = "revault.io/original-reclaim-policy"
	// Media key of spec.dataMoverConfig: the worker pool of a series the data mover creates.
	DataMoverConfigMedia = "revault.io/media"
)

// SnapshotID is the data mover's snapshot ID: the version of a series, "NAMESPACE/SERIES@VERSION".
func SnapshotID(ns, series string, version int64) string {
	return fmt.Sprintf("%s@%d", SeriesID(ns, series), version)
}

// ParseSnapshotID reads an ID made by SnapshotID.
func ParseSnapshotID(id string) (ns, series string, version int64, err error) {
	bad := fmt.Errorf("snapshot ID %q is not NAMESPACE/SERIES@VERSION (a revault data mover snapshot)", id)
	name, v, ok := strings.Cut(id, "@")
	if !ok {
		return "", "", 0, bad
	}
	ns, series, ok = strings.Cut(name, "/")
	if !ok || ns == "" || series == "" || strings.Contains(series, "/") {
		return "", "", 0, bad
	}
	version, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil || version < 1 {
		return "", "", 0, bad
	}
	return ns, series, version, nil
}

// DataMoverRef is the value of AnnotationDataMover.
func DataMoverRef(kind, ns, name string) string { return kind + " " + ns + "/" + name }

// DataUploadObjectName names the snapshot PVC and backup Job of a DataUpload.
func DataUploadObjectName(du string) string { return fitName("revault-du-"+du, "", maxLabel) }

// DataDownloadObjectName names the restore PVC and RestoreJob of a DataDownload.
func DataDownloadObjectName(dd string) string { return fitName("revault-dd-"+dd, "", maxLabel) }

func dataMoverLabels(component, owner string) map[string]string {
	l := commonLabels(component)
	l[LabelDataMover] = LabelValue(owner)
	return l
}

// DataMoverSeries is the BackupSeries the data mover creates for a PVC that has none: on demand
// only, its data retained when the object goes (Velero owns the versions' lifetimes).
func DataMoverSeries(ns, pvc string, media backupv1alpha1.Media, owner string) *backupv1alpha1.BackupSeries {
	return &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvc, Namespace: ns,
			Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelDataMover: LabelValue(owner)},
			Annotations: map[string]string{AnnotationDataMover: owner},
		},
		Spec: backupv1alpha1.BackupSeriesSpec{
			Source:         backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: pvc}},
			Storage:        backupv1alpha1.StorageSpec{Media: media},
			Dedup:          backupv1alpha1.DedupSpec{Unit: backupv1alpha1.DedupSegment},
			DeletionPolicy: backupv1alpha1.DeletionRetain,
		},
	}
}

// MediaFromConfig is the media a DataUpload asks for (spec.dataMoverConfig), ssd by default.
func MediaFromConfig(cfg map[string]string) (backupv1alpha1.Media, error) {
	switch m := backupv1alpha1.Media(cfg[DataMoverConfigMedia]); m {
	case "":
		return backupv1alpha1.MediaSSD, nil
	case backupv1alpha1.MediaSSD, backupv1alpha1.MediaHDD:
		return m, nil
	default:
		return "", fmt.Errorf("dataMoverConfig %s=%q: want ssd or hdd", DataMoverConfigMedia, m)
	}
}

// CheckDataUpload says why the data mover cannot serve a DataUpload ("" if it can).
func CheckDataUpload(du *velerov2alpha1.DataUpload) string {
	switch {
	case du.Spec.SnapshotType != velerov2alpha1.SnapshotTypeCSI:
		return fmt.Sprintf("snapshotType %q is not supported: the revault data mover reads CSI snapshots", du.Spec.SnapshotType)
	case du.Spec.CSISnapshot == nil || du.Spec.CSISnapshot.VolumeSnapshot == "":
		return "spec.csiSnapshot.volumeSnapshot is empty: no snapshot to read"
	case du.Spec.SourceNamespace == "" || du.Spec.SourcePVC == "":
		return "spec.sourceNamespace and spec.sourcePVC are required"
	}
	if _, err := MediaFromConfig(du.Spec.DataMoverConfig); err != nil {
		return err.Error()
	}
	return ""
}

// SnapshotPVC exposes a DataUpload's CSI snapshot as a volume the backup Job mounts: a PVC of the
// snapshot's storage class, as large as the source PVC, restored from the VolumeSnapshot.
func SnapshotPVC(du *velerov2alpha1.DataUpload, source *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	sc := du.Spec.CSISnapshot.StorageClass
	var scPtr *string
	if sc != "" {
		scPtr = &sc
	} else {
		scPtr = source.Spec.StorageClassName
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: DataUploadObjectName(du.Name), Namespace: du.Spec.SourceNamespace,
			Labels:      dataMoverLabels(ComponentDataMover, du.Name),
			Annotations: map[string]string{AnnotationDataMover: DataMoverRef("DataUpload", du.Namespace, du.Name)},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: scPtr,
			VolumeMode:       source.Spec.VolumeMode,
			Resources:        corev1.VolumeResourceRequirements{Requests: source.Spec.Resources.Requests.DeepCopy()},
			DataSource: &corev1.TypedLocalObjectReference{
				APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: du.Spec.CSISnapshot.VolumeSnapshot,
			},
		},
	}
}

// DataUploadJob is the backup Job of a DataUpload: the series' backup Job, reading the snapshot
// PVC instead of the live one. It carries the series' labels, so the BackupSeries shows it.
func DataUploadJob(cfg *config.Config, bs *backupv1alpha1.BackupSeries, endpoint string, du *velerov2alpha1.DataUpload) *batchv1.Job {
	fromSnapshot := bs.DeepCopy()
	fromSnapshot.Spec.Source = backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: DataUploadObjectName(du.Name)}}
	spec := BackupJobSpec(cfg, fromSnapshot, endpoint)
	spec.TTLSecondsAfterFinished = cfg.Jobs.TTLSecondsAfterFinished
	labels := BackupLabels(bs.Name)
	labels[LabelDataMover] = LabelValue(du.Name)
	spec.Template.Labels = labels
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: DataUploadObjectName(du.Name), Namespace: bs.Namespace,
			Labels: labels,
			Annotations: map[string]string{
				AnnotationSeries:    bs.Name,
				AnnotationDataMover: DataMoverRef("DataUpload", du.Namespace, du.Name),
			},
		},
		Spec: spec,
	}
}

// RestorePVC is the volume a DataDownload restores into before it is bound to the target PVC
// (whose selector, set by Velero, only matches a volume the data mover labels): like the target,
// without its selector, in the namespace ns of the series restored (which differs from the
// target's under namespace mapping).
func RestorePVC(dd *velerov2alpha1.DataDownload, ns string, target *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: DataDownloadObjectName(dd.Name), Namespace: ns,
			Labels:      dataMoverLabels(ComponentDataMover, dd.Name),
			Annotations: map[string]string{AnnotationDataMover: DataMoverRef("DataDownload", dd.Namespace, dd.Name)},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      target.Spec.AccessModes,
			StorageClassName: target.Spec.StorageClassName,
			VolumeMode:       target.Spec.VolumeMode,
			Resources:        corev1.VolumeResourceRequirements{Requests: target.Spec.Resources.Requests.DeepCopy()},
		},
	}
}

// DataDownloadRestore is the RestoreJob that fills a DataDownload's restore PVC, in the namespace
// ns of the series.
func DataDownloadRestore(dd *velerov2alpha1.DataDownload, ns, series string, version int64) *backupv1alpha1.RestoreJob {
	return &backupv1alpha1.RestoreJob{
		ObjectMeta: metav1.ObjectMeta{
			Name: DataDownloadObjectName(dd.Name), Namespace: ns,
			Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelDataMover: LabelValue(dd.Name)},
			Annotations: map[string]string{AnnotationDataMover: DataMoverRef("DataDownload", dd.Namespace, dd.Name)},
		},
		Spec: backupv1alpha1.RestoreJobSpec{
			SeriesRef: backupv1alpha1.LocalObjectReference{Name: series},
			Version:   strconv.FormatInt(version, 10),
			TargetPVC: backupv1alpha1.PVCTarget{ClaimName: DataDownloadObjectName(dd.Name)},
		},
	}
}
