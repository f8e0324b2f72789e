package plan

import (
	"strings"
	"testing"

	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

func TestSnapshotIDRoundTrips(t *testing.T) {
	id := SnapshotID("shop", "postgres-data.1", 42)
	if id != "shop/postgres-data.1@42" {
		t.Fatalf("SnapshotID = %q", id)
	}
	ns, series, v, err := ParseSnapshotID(id)
	if err != nil || ns != "shop" || series != "postgres-data.1" || v != 42 {
		t.Fatalf("ParseSnapshotID(%q) = %q %q %d %v", id, ns, series, v, err)
	}
	for _, bad := range []string{"", "shop/db", "shop@3", "/db@3", "shop/@3", "shop/db@0", "shop/db@-1", "shop/db@x", "a/b/c@1", "kopia:abcdef"} {
		if _, _, _, err := ParseSnapshotID(bad); err == nil || !strings.Contains(err.Error(), "NAMESPACE/SERIES@VERSION") {
			t.Errorf("ParseSnapshotID(%q) = %v, want an error naming the format", bad, err)
		}
	}
}

func TestCheckDataUpload(t *testing.T) {
	ok := velerov2alpha1.DataUpload{Spec: velerov2alpha1.DataUploadSpec{
		SnapshotType: velerov2alpha1.SnapshotTypeCSI, CSISnapshot: &velerov2alpha1.CSISnapshotSpec{VolumeSnapshot: "s"},
		SourceNamespace: "ns", SourcePVC: "data",
	}}
	if why := CheckDataUpload(&ok); why != "" {
		t.Fatalf("a valid DataUpload is refused: %s", why)
	}
	cases := map[string]func(*velerov2alpha1.DataUpload){
		`snapshotType "" is not supported`:         func(d *velerov2alpha1.DataUpload) { d.Spec.SnapshotType = "" },
		"spec.csiSnapshot.volumeSnapshot is empty": func(d *velerov2alpha1.DataUpload) { d.Spec.CSISnapshot = nil },
		"spec.sourceNamespace and spec.sourcePVC":  func(d *velerov2alpha1.DataUpload) { d.Spec.SourcePVC = "" },
		`want ssd or hdd`: func(d *velerov2alpha1.DataUpload) {
			d.Spec.DataMoverConfig = map[string]string{DataMoverConfigMedia: "tape"}
		},
	}
	for want, mutate := range cases {
		d := ok.DeepCopy()
		mutate(d)
		if why := CheckDataUpload(d); !strings.Contains(why, want) {
			t.Errorf("got %q, want it to contain %q", why, want)
		}
	}
	if m, _ := MediaFromConfig(map[string]string{DataMoverConfigMedia: "hdd"}); m != backupv1alpha1.MediaHDD {
		t.Errorf("media hdd: got %q", m)
	}
}

func TestDataMoverObjects(t *testing.T) {
	cfg := testConfig(t)
	du := &velerov2alpha1.DataUpload{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly-20260101-x7k2p", Namespace: "velero"},
		Spec: velerov2alpha1.DataUploadSpec{
			SnapshotType: velerov2alpha1.SnapshotTypeCSI,
			CSISnapshot:  &velerov2alpha1.CSISnapshotSpec{VolumeSnapshot: "velero-data-abc", StorageClass: "csi-rbd"},
			SourcePVC:    "data", SourceNamespace: "shop",
		},
	}
	src := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr.To("other"),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}},
	}}
	pvc := SnapshotPVC(du, src)
	if pvc.Namespace != "shop" || *pvc.Spec.StorageClassName != "csi-rbd" || pvc.Spec.DataSource.Name != "velero-data-abc" ||
		pvc.Spec.DataSource.Kind != "VolumeSnapshot" || pvc.Spec.Resources.Requests.Storage().String() != "5Gi" {
		t.Fatalf("snapshot PVC: %+v", pvc)
	}
	bs := DataMoverSeries("shop", "data", backupv1alpha1.MediaSSD, DataMoverRef("DataUpload", "velero", du.Name))
	job := DataUploadJob(cfg, bs, "http://w:8420", du)
	if job.Name != pvc.Name || job.Namespace != "shop" || job.Annotations[AnnotationSeries] != "data" {
		t.Fatalf("job meta: %+v", job.ObjectMeta)
	}
	if c := job.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim; c.ClaimName != pvc.Name || !c.ReadOnly {
		t.Fatalf("the Job must read the snapshot volume read-only: %+v", c)
	}
	args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--series shop/data") || !strings.HasSuffix(args, JobDataDir) {
		t.Fatalf("args: %s", args)
	}
	if job.Labels[LabelSeries] != "data" || job.Labels[LabelComponent] != ComponentBackup {
		t.Fatalf("the Job counts as the series' backup Job: %v", job.Labels)
	}
	long := DataUploadObjectName(strings.Repeat("x", 100))
	if len(long) > 63 {
		t.Fatalf("names fit a label: %d", len(long))
	}
	dd := &velerov2alpha1.DataDownload{ObjectMeta: metav1.ObjectMeta{Name: "r-1", Namespace: "velero"},
		Spec: velerov2alpha1.DataDownloadSpec{TargetVolume: velerov2alpha1.TargetVolumeSpec{PVC: "data", Namespace: "shop"}}}
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "shop"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To("csi-rbd"),
			Selector:  &metav1.LabelSelector{MatchLabels: map[string]string{"velero.io/dynamic-pv-restore": "x"}},
			Resources: src.Spec.Resources,
		}}
	// Under namespace mapping (shop-old's series into shop) the restore runs in the series' namespace.
	rp := RestorePVC(dd, "shop-old", target)
	if rp.Spec.Selector != nil || *rp.Spec.StorageClassName != "csi-rbd" || rp.Namespace != "shop-old" {
		t.Fatalf("restore PVC: %+v", rp.Spec)
	}
	rj := DataDownloadRestore(dd, "shop-old", "data", 7)
	if rj.Spec.Version != "7" || rj.Spec.SeriesRef.Name != "data" || rj.Spec.TargetPVC.ClaimName != rp.Name || rj.Namespace != "shop-old" {
		t.Fatalf("restore job: %+v", rj.Spec)
	}
}
