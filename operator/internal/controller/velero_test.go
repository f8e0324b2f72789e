package controller

import (
	"fmt"
	"strings"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// The Velero integration as the operator sees it: on-demand backups that report the version
// they made (what the Velero plugin's BackupItemAction waits for), and the data mover serving
// DataUpload/DataDownload objects (CRDs installed from the Velero module).

const veleroNS = "velero"

var veleroNSOnce = false

func ensureVeleroNS() {
	if veleroNSOnce {
		return
	}
	err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: veleroNS}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	veleroNSOnce = true
}

func backupNowEntry(ns, series, request string) *backupv1alpha1.BackupNowResult {
	for _, e := range getSeries(ns, series).Status.BackupNow {
		if e.Request == request {
			return &e
		}
	}
	return nil
}

func pvcWithSize(ns, name, size string, selector map[string]string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("csi-hostpath"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if selector != nil {
		pvc.Spec.Selector = &metav1.LabelSelector{MatchLabels: selector}
	}
	Expect(k8sClient.Create(ctx, pvc)).To(Succeed())
	return pvc
}

// pvcGone reports whether a PVC is gone, playing the PVC protection controller (which envtest
// lacks) for a PVC whose deletion was requested: it drops the protection finalizer.
func pvcGone(ns, name string) bool {
	pvc := &corev1.PersistentVolumeClaim{}
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pvc)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err == nil && pvc.DeletionTimestamp != nil && len(pvc.Finalizers) > 0 {
		pvc.Finalizers = nil
		_ = k8sClient.Update(ctx, pvc)
	}
	return false
}

func newDataUpload(name, ns, pvc string, mutate func(*velerov2alpha1.DataUpload)) *velerov2alpha1.DataUpload {
	du := &velerov2alpha1.DataUpload{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: veleroNS, Labels: map[string]string{velerov1.BackupNameLabel: "backup-1"}},
		Spec: velerov2alpha1.DataUploadSpec{
			SnapshotType:          velerov2alpha1.SnapshotTypeCSI,
			CSISnapshot:           &velerov2alpha1.CSISnapshotSpec{VolumeSnapshot: "snap-" + pvc, StorageClass: "csi-hostpath"},
			SourcePVC:             pvc,
			SourceNamespace:       ns,
			DataMover:             plan.DataMoverName,
			BackupStorageLocation: "default",
			OperationTimeout:      metav1.Duration{Duration: time.Minute},
		},
	}
	if mutate != nil {
		mutate(du)
	}
	Expect(k8sClient.Create(ctx, du)).To(Succeed())
	return du
}

// csiSnapshot makes the VolumeSnapshot Velero takes before a DataUpload, bound to a content with
// the given deletion policy (envtest runs no snapshot controller: the test plays it).
func csiSnapshot(ns, name, backupName string, policy snapshotv1.DeletionPolicy) *snapshotv1.VolumeSnapshotContent {
	vsc := &snapshotv1.VolumeSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Name: "content-" + ns + "-" + name},
		Spec: snapshotv1.VolumeSnapshotContentSpec{
			DeletionPolicy:    policy,
			Driver:            "hostpath.csi.k8s.io",
			Source:            snapshotv1.VolumeSnapshotContentSource{SnapshotHandle: ptr.To("handle-" + name)},
			VolumeSnapshotRef: corev1.ObjectReference{Namespace: ns, Name: name},
		},
	}
	Expect(k8sClient.Create(ctx, vsc)).To(Succeed())
	vs := &snapshotv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{velerov1.BackupNameLabel: backupName}},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{
			VolumeSnapshotContentName: ptr.To(vsc.Name)}},
	}
	Expect(k8sClient.Create(ctx, vs)).To(Succeed())
	vs.Status = &snapshotv1.VolumeSnapshotStatus{BoundVolumeSnapshotContentName: ptr.To(vsc.Name), ReadyToUse: ptr.To(true)}
	Expect(k8sClient.Status().Update(ctx, vs)).To(Succeed())
	return vsc
}

func getDU(name string) *velerov2alpha1.DataUpload {
	du := &velerov2alpha1.DataUpload{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: veleroNS, Name: name}, du)).To(Succeed())
	return du
}

func getDD(name string) *velerov2alpha1.DataDownload {
	dd := &velerov2alpha1.DataDownload{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: veleroNS, Name: name}, dd)).To(Succeed())
	return dd
}

var _ = Describe("Velero integration", func() {
	BeforeEach(requireWorkers)
	BeforeEach(ensureVeleroNS)

	It("reports each backup-now request's progress and the version it made", func() {
		ns := newNamespace("bnow")
		bs := placedSeries(pvcSeries(ns, "data"))
		node := bs.Status.Worker.Node
		waitToken(ns, node)
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "velero-backup-1")
		var job batchv1.Job
		Eventually(func(g Gomega) {
			e := backupNowEntry(ns, "data", "velero-backup-1")
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.Phase).To(Equal(backupv1alpha1.BackupNowRunning))
			g.Expect(e.Job).To(Equal(plan.BackupNowJobName("data", "velero-backup-1")))
			g.Expect(e.StartTime).NotTo(BeNil())
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: e.Job}, &job)).To(Succeed())
		}).Should(Succeed())

		By("showing the bytes the worker has read while the Job's push runs")
		finishPush := startStdinPush(ns, "data", node, func(i, j int) byte { return byte(i*7 + j*13 + j>>9) })
		Eventually(func() int64 {
			e := backupNowEntry(ns, "data", "velero-backup-1")
			if e == nil {
				return 0
			}
			return e.LogicalBytes
		}).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 8<<20))
		finishPush()

		By("recording the version from the Job's report when it ends")
		report := push(ns, "data", node, randomTree(128))
		finishJob(&job, true, report)
		Eventually(func(g Gomega) {
			e := backupNowEntry(ns, "data", "velero-backup-1")
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.Phase).To(Equal(backupv1alpha1.BackupNowSucceeded))
			g.Expect(e.Version).To(BeEquivalentTo(2), "the report's version (the stdin push made version 1)")
			g.Expect(e.LogicalBytes).To(BeNumerically(">=", 128*1024))
			g.Expect(e.CompletionTime).NotTo(BeNil())
			g.Expect(e.Message).To(BeEmpty())
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("recording a failure with the worker's message")
		annotate(getSeries(ns, "data"), backupv1alpha1.BackupNowAnnotation, "velero-backup-2")
		var job2 batchv1.Job
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.BackupNowJobName("data", "velero-backup-2")}, &job2)
		}).Should(Succeed())
		finishJob(&job2, false, "{\"error\": {\"code\": \"io_error\", \"message\": \"disk on fire\"}}\nerror: disk on fire\n")
		Eventually(func(g Gomega) {
			// The request's entry appears with the operator's next reconcile.
			e := backupNowEntry(ns, "data", "velero-backup-2")
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.Phase).To(Equal(backupv1alpha1.BackupNowFailed))
			g.Expect(e.Message).To(Equal("disk on fire"))
			g.Expect(e.Version).To(BeZero())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(backupNowEntry(ns, "data", "velero-backup-1").Version).To(BeEquivalentTo(2), "older entries stay")
	})

	It("moves a DataUpload's snapshot into the PVC's series and a DataDownload back into the target PVC", func() {
		ns := newNamespace("dm")
		pvcWithSize(ns, "data", "2Gi", nil)
		vsc := csiSnapshot(ns, "snap-data", "backup-1", snapshotv1.VolumeSnapshotContentRetain)
		du := newDataUpload("backup-1-abcde", ns, "data", nil)

		By("creating the PVC's series, the snapshot volume and the backup Job")
		var job batchv1.Job
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(du.Name)}, &job)).To(Succeed())
		}).WithTimeout(30 * time.Second).Should(Succeed())
		bs := getSeries(ns, "data")
		Expect(bs.Spec.Source.PVC.ClaimName).To(Equal("data"))
		Expect(bs.Spec.DeletionPolicy).To(Equal(backupv1alpha1.DeletionRetain))
		snapPVC := &corev1.PersistentVolumeClaim{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(du.Name)}, snapPVC)).To(Succeed())
		Expect(snapPVC.Spec.DataSource).NotTo(BeNil())
		Expect(snapPVC.Spec.DataSource.Kind).To(Equal("VolumeSnapshot"))
		Expect(snapPVC.Spec.DataSource.Name).To(Equal("snap-data"))
		Expect(*snapPVC.Spec.StorageClassName).To(Equal("csi-hostpath"))
		Expect(snapPVC.Spec.Resources.Requests.Storage().String()).To(Equal("2Gi"))
		Expect(job.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.ClaimName).To(Equal(snapPVC.Name))
		Expect(strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")).To(ContainSubstring("--series " + ns + "/data"))
		Eventually(func(g Gomega) {
			st := getDU(du.Name).Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataUploadPhaseInProgress))
			g.Expect(st.Progress.TotalBytes).To(BeEquivalentTo(2 << 30))
			g.Expect(st.StartTimestamp).NotTo(BeNil())
		}).Should(Succeed())

		By("reporting the bytes the worker has read while a push into the series runs")
		node := getSeries(ns, "data").Status.Worker.Node
		waitToken(ns, node)
		finishPush := startStdinPush(ns, "data", node, func(i, j int) byte { return byte(i*11 + j*7 + j>>10) })
		Eventually(func() int64 { return getDU(du.Name).Status.Progress.BytesDone }).
			WithTimeout(30 * time.Second).Should(BeNumerically(">=", 8<<20))
		Expect(getDU(du.Name).Status.Phase).To(Equal(velerov2alpha1.DataUploadPhaseInProgress))
		finishPush()

		By("completing with the snapshot ID once the Job's push committed")
		src := randomTree(256)
		out, ok := runJobPod(&job, ns, node, src)
		Expect(ok).To(BeTrue(), out)
		finishJob(&job, true, out)
		Eventually(func(g Gomega) {
			st := getDU(du.Name).Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataUploadPhaseCompleted), st.Message)
			g.Expect(st.SnapshotID).To(Equal(ns+"/data@2"), "the Job's version (the stdin push made version 1)")
			g.Expect(st.Progress.BytesDone).To(BeNumerically(">=", 256*1024))
			g.Expect(st.Progress.BytesDone).To(Equal(st.Progress.TotalBytes))
			g.Expect(st.IncrementalBytes).To(BeNumerically(">", 0))
			g.Expect(st.CompletionTimestamp).NotTo(BeNil())
			g.Expect((*st.DataMoverResult)["version"]).To(Equal("2"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() bool { return pvcGone(ns, snapPVC.Name) }).Should(BeTrue(), "the snapshot volume is deleted")
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "snap-data"}, &snapshotv1.VolumeSnapshot{}))
		}).Should(BeTrue(), "Velero's VolumeSnapshot is deleted once its data is in Revault")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(vsc), vsc)).To(Succeed())
		Expect(vsc.Spec.DeletionPolicy).To(Equal(snapshotv1.VolumeSnapshotContentDelete), "and the storage system's snapshot with it")
		Eventually(func() []string { return eventReasons(getDU(du.Name)) }).Should(ContainElements("BackupStarted", "DataUploadCompleted"))

		By("restoring it: a RestoreJob fills a fresh volume, which is then bound to Velero's target PVC")
		Expect(k8sClient.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data"}})).To(Succeed())
		Eventually(func() bool { return pvcGone(ns, "data") }).Should(BeTrue())
		downloadInto("restore-1-fghij", ns, 2, node, ns, src)
	})

	It("restores into another namespace (Velero's namespace mapping): the restore runs in the series' namespace", func() {
		from, into := newNamespace("dmfrom"), newNamespace("dminto")
		bs := placedSeries(pvcSeries(from, "data"))
		node := bs.Status.Worker.Node
		src := randomTree(256)
		push(from, "data", node, src)
		downloadInto("mapped-1-klmno", from, 1, node, into, src)
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: into, Name: "data"}, &backupv1alpha1.BackupSeries{}))).
			To(BeTrue(), "no series, token or restore object is made in the target namespace")
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: into, Name: plan.NamespaceTokenSecret}, &corev1.Secret{}))).To(BeTrue())
	})

	It("restores a series whose BackupSeries is gone from the pool that holds it, and fails one no worker holds", func() {
		ns := newNamespace("dmhdd")
		bs := pvcSeries(ns, "db")
		bs.Spec.Storage.Media = backupv1alpha1.MediaHDD
		bs.Spec.DeletionPolicy = backupv1alpha1.DeletionRetain
		bs = placedSeries(bs)
		Expect(bs.Status.Worker.Media).To(Equal(backupv1alpha1.MediaHDD))
		node := bs.Status.Worker.Node
		push(ns, "db", node, randomTree(64))

		By("deleting the BackupSeries (as deleting its namespace does), its data kept on the HDD worker")
		Expect(k8sClient.Delete(ctx, bs)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{}))
		}).WithTimeout(20 * time.Second).Should(BeTrue())

		pvcWithSize(ns, "db", "1Gi", map[string]string{"velero.io/dynamic-pv-restore": ns + ".db.abcde"})
		download := func(name, id string) {
			Expect(k8sClient.Create(ctx, &velerov2alpha1.DataDownload{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: veleroNS},
				Spec: velerov2alpha1.DataDownloadSpec{
					TargetVolume: velerov2alpha1.TargetVolumeSpec{PVC: "db", Namespace: ns},
					DataMover:    plan.DataMoverName, SnapshotID: id, SourceNamespace: ns,
					OperationTimeout: metav1.Duration{Duration: time.Minute},
				},
			})).To(Succeed())
		}
		download("hdd-back", ns+"/db@1")
		Eventually(func(g Gomega) {
			rj := &backupv1alpha1.RestoreJob{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataDownloadObjectName("hdd-back")}, rj)).To(Succeed())
			g.Expect(rj.Status.JobName).NotTo(BeEmpty(), "the version was found: the series is on the worker that holds it")
		}).WithTimeout(30 * time.Second).Should(Succeed())
		again := getSeries(ns, "db")
		Expect(again.Spec.Storage.Media).To(Equal(backupv1alpha1.MediaHDD))
		Expect(again.Status.Worker.Node).To(Equal(node))
		Expect(again.Status.VersionCount).To(BeEquivalentTo(1))

		By("failing, naming both, when two workers hold the version")
		push(ns, "twice", "node-ssd-1", randomTree(16))
		push(ns, "twice", "node-hdd-1", randomTree(16))
		download("twice-back", ns+"/twice@1")
		Eventually(func(g Gomega) {
			st := getDD("twice-back").Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseFailed))
			g.Expect(st.Message).To(ContainSubstring("version 1 of series " + ns + "/twice is held by 2 workers (ssd worker on node-ssd-1, hdd worker on node-hdd-1)"))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("failing, without making an empty series, when no worker holds the series")
		download("ghost-back", ns+"/ghost@1")
		Eventually(func(g Gomega) {
			st := getDD("ghost-back").Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseFailed))
			g.Expect(st.Message).To(ContainSubstring("no Revault worker holds version 1 of series " + ns + "/ghost"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ghost"}, &backupv1alpha1.BackupSeries{}))).To(BeTrue())
	})

	It("fails DataUploads and DataDownloads it cannot serve, with a clear message", func() {
		ns := newNamespace("dmfail")
		pvcWithSize(ns, "db", "1Gi", nil)

		By("refusing what is not a CSI snapshot")
		bad := newDataUpload("bad-type", ns, "db", func(du *velerov2alpha1.DataUpload) { du.Spec.SnapshotType = "Restic" })
		Eventually(func(g Gomega) {
			st := getDU(bad.Name).Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataUploadPhaseFailed))
			g.Expect(st.Message).To(ContainSubstring(`snapshotType "Restic" is not supported`))
			g.Expect(st.CompletionTimestamp).NotTo(BeNil())
		}).Should(Succeed())

		By("deleting no snapshot for a DataUpload it refused, nor one of another backup")
		keep := csiSnapshot(ns, "snap-keep", "backup-other", snapshotv1.VolumeSnapshotContentRetain)
		refused := newDataUpload("refused-snap", ns, "db", func(du *velerov2alpha1.DataUpload) {
			du.Spec.SnapshotType = "Restic"
			du.Spec.CSISnapshot.VolumeSnapshot = "snap-keep"
		})
		Eventually(func() velerov2alpha1.DataUploadPhase { return getDU(refused.Name).Status.Phase }).
			Should(Equal(velerov2alpha1.DataUploadPhaseFailed))
		pvcWithSize(ns, "other", "1Gi", nil)
		otherBackup := newDataUpload("other-backup", ns, "other", func(du *velerov2alpha1.DataUpload) {
			du.Spec.CSISnapshot.VolumeSnapshot = "snap-keep"
		})
		var otherJob batchv1.Job
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(otherBackup.Name)}, &otherJob)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		finishJob(&otherJob, false, "error: test\n")
		Eventually(func() velerov2alpha1.DataUploadPhase { return getDU(otherBackup.Name).Status.Phase }).
			WithTimeout(20 * time.Second).Should(Equal(velerov2alpha1.DataUploadPhaseFailed))
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "snap-keep"}, &snapshotv1.VolumeSnapshot{})).To(Succeed())
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(keep), keep)).To(Succeed())
		Expect(keep.Spec.DeletionPolicy).To(Equal(snapshotv1.VolumeSnapshotContentRetain))

		By("leaving other data movers' DataUploads alone")
		other := newDataUpload("velero-own", ns, "db", func(du *velerov2alpha1.DataUpload) { du.Spec.DataMover = "velero" })
		Consistently(func() velerov2alpha1.DataUploadPhase { return getDU(other.Name).Status.Phase }).
			WithTimeout(2 * time.Second).Should(BeEmpty())

		By("failing with the worker's message when the backup Job fails")
		csiSnapshot(ns, "snap-db", "backup-1", snapshotv1.VolumeSnapshotContentDelete)
		du := newDataUpload("fails", ns, "db", nil)
		var job batchv1.Job
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(du.Name)}, &job)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		finishJob(&job, false, "error: series "+ns+"/db is on a full disk\n")
		Eventually(func(g Gomega) {
			st := getDU(du.Name).Status
			g.Expect(st.Phase).To(Equal(velerov2alpha1.DataUploadPhaseFailed))
			g.Expect(st.Message).To(Equal("backup Job " + ns + "/" + job.Name + " failed: series " + ns + "/db is on a full disk"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() bool { return pvcGone(ns, job.Name) }).Should(BeTrue(), "the snapshot volume is deleted on failure too")
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "snap-db"}, &snapshotv1.VolumeSnapshot{}))
		}).Should(BeTrue(), "and so is Velero's VolumeSnapshot")

		By("canceling when Velero asks")
		pvcWithSize(ns, "logs", "1Gi", nil)
		c := newDataUpload("cancel-me", ns, "logs", nil)
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.DataUploadObjectName(c.Name)}, &batchv1.Job{})
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func() error {
			cur := getDU(c.Name)
			cur.Spec.Cancel = true
			return k8sClient.Update(ctx, cur)
		}).Should(Succeed())
		Eventually(func() velerov2alpha1.DataUploadPhase { return getDU(c.Name).Status.Phase }).
			Should(Equal(velerov2alpha1.DataUploadPhaseCanceled))

		By("refusing a mapped restore whose series' namespace is gone, and a snapshot ID it did not make")
		owner := mappingRestore("restore-gone-"+ns, "gone-"+ns, ns)
		for name, id := range map[string]string{"cross-ns": "gone-" + ns + "/db@1", "foreign-id": "kopia-snapshot-1234",
			"unmapped": "default/db@1"} {
			dd := &velerov2alpha1.DataDownload{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: veleroNS, OwnerReferences: owner},
				Spec: velerov2alpha1.DataDownloadSpec{
					TargetVolume: velerov2alpha1.TargetVolumeSpec{PVC: "db", Namespace: ns},
					DataMover:    plan.DataMoverName, SnapshotID: id, SourceNamespace: "gone-" + ns,
				},
			}
			Expect(k8sClient.Create(ctx, dd)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(getDD("cross-ns").Status.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseFailed))
			g.Expect(getDD("cross-ns").Status.Message).To(ContainSubstring("belongs to series gone-" + ns + "/db, whose namespace no longer exists"))
			g.Expect(getDD("unmapped").Status.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseFailed))
			g.Expect(getDD("unmapped").Status.Message).To(ContainSubstring(
				"restoring series of namespace default into namespace " + ns + " needs a Velero Restore owning this DataDownload that maps default to " + ns))
			g.Expect(getDD("foreign-id").Status.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseFailed))
			g.Expect(getDD("foreign-id").Status.Message).To(ContainSubstring("is not NAMESPACE/SERIES@VERSION"))
		}).Should(Succeed())
	})
})

// downloadInto plays a Velero restore of version of series seriesNS/data through the data mover into
// a new PVC "data" of targetNS: the DataDownload's RestoreJob (in the series' namespace) restores
// src byte-exact with a real `revault pull`, and its volume is handed over to the target PVC.
func downloadInto(ddName, seriesNS string, version int64, node, targetNS, src string) {
	selector := map[string]string{"velero.io/dynamic-pv-restore": targetNS + ".data.x1y2z"}
	pvcWithSize(targetNS, "data", "2Gi", selector)
	dd := &velerov2alpha1.DataDownload{
		ObjectMeta: metav1.ObjectMeta{Name: ddName, Namespace: veleroNS},
		Spec: velerov2alpha1.DataDownloadSpec{
			TargetVolume:          velerov2alpha1.TargetVolumeSpec{PVC: "data", Namespace: targetNS},
			BackupStorageLocation: "default",
			DataMover:             plan.DataMoverName,
			SnapshotID:            plan.SnapshotID(seriesNS, "data", version),
			SourceNamespace:       seriesNS,
			OperationTimeout:      metav1.Duration{Duration: time.Minute},
		},
	}
	if seriesNS != targetNS {
		dd.OwnerReferences = mappingRestore("restore-"+ddName, seriesNS, targetNS)
	}
	Expect(k8sClient.Create(ctx, dd)).To(Succeed())
	name := plan.DataDownloadObjectName(dd.Name)
	var rj backupv1alpha1.RestoreJob
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: seriesNS, Name: name}, &rj)).To(Succeed())
		g.Expect(rj.Status.JobName).NotTo(BeEmpty())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	Expect(rj.Spec.SeriesRef.Name).To(Equal("data"))
	Expect(rj.Spec.Version).To(Equal(fmt.Sprint(version)))
	Expect(rj.Spec.TargetPVC.ClaimName).To(Equal(name))
	restorePVC := &corev1.PersistentVolumeClaim{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: seriesNS, Name: name}, restorePVC)).To(Succeed())
	Expect(restorePVC.Spec.Selector).To(BeNil())
	Expect(getDD(dd.Name).Status.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseInProgress))

	restoreJob := &batchv1.Job{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: seriesNS, Name: rj.Status.JobName}, restoreJob)).To(Succeed())
	into := GinkgoT().TempDir()
	pullOut, ok := runJobPod(restoreJob, seriesNS, node, into)
	Expect(ok).To(BeTrue(), pullOut)
	sameTree(src, into)
	finishJob(restoreJob, true, pullOut)

	// Play the PV controller: the restore volume got a PV when the restore pod mounted it.
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + targetNS},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "csi-hostpath",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: seriesNS, Name: name, UID: restorePVC.UID},
		},
	}
	Expect(k8sClient.Create(ctx, pv)).To(Succeed())
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(restorePVC), restorePVC)).To(Succeed())
	restorePVC.Spec.VolumeName = pv.Name
	Expect(k8sClient.Update(ctx, restorePVC)).To(Succeed())

	By("handing the volume over: retained, relabelled, claimed by the target PVC")
	Eventually(func(g Gomega) {
		g.Expect(pvcGone(seriesNS, restorePVC.Name)).To(BeTrue())
		cur := &corev1.PersistentVolume{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pv), cur)).To(Succeed())
		g.Expect(cur.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain))
		g.Expect(cur.Spec.ClaimRef.Name).To(Equal("data"))
		g.Expect(cur.Labels).To(HaveKeyWithValue("velero.io/dynamic-pv-restore", selector["velero.io/dynamic-pv-restore"]))
		target := &corev1.PersistentVolumeClaim{}
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: targetNS, Name: "data"}, target)).To(Succeed())
		g.Expect(target.Spec.VolumeName).To(Equal(pv.Name))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	Expect(getDD(dd.Name).Status.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseInProgress), "not done before the volume binds")

	// Play the PV controller again: the volume binds to the target.
	Eventually(func() error {
		cur := &corev1.PersistentVolume{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pv), cur); err != nil {
			return err
		}
		cur.Status.Phase = corev1.VolumeBound
		return k8sClient.Status().Update(ctx, cur)
	}).Should(Succeed())
	Eventually(func(g Gomega) {
		st := getDD(dd.Name).Status
		g.Expect(st.Phase).To(Equal(velerov2alpha1.DataDownloadPhaseCompleted), st.Message)
		g.Expect(st.Progress.BytesDone).To(BeNumerically(">=", 256*1024))
		cur := &corev1.PersistentVolume{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pv), cur)).To(Succeed())
		g.Expect(cur.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete), "the reclaim policy is back")
		g.Expect(cur.Annotations).NotTo(HaveKey(plan.AnnotationReclaimPolicy))
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// mappingRestore makes a Velero Restore mapping namespace from to namespace to, and returns the
// owner reference Velero puts on the DataDownloads it makes.
func mappingRestore(name, from, to string) []metav1.OwnerReference {
	ensureVeleroNS()
	rs := &velerov1.Restore{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: veleroNS},
		Spec:       velerov1.RestoreSpec{BackupName: "backup-1", NamespaceMapping: map[string]string{from: to}},
	}
	Expect(k8sClient.Create(ctx, rs)).To(Succeed())
	return []metav1.OwnerReference{{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Restore",
		Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}
}
