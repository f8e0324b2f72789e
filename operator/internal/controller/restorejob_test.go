package controller

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

func getRestore(ns, name string) *backupv1alpha1.RestoreJob {
	rj := &backupv1alpha1.RestoreJob{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rj)).To(Succeed())
	return rj
}

func makePVC(ns, name string) {
	Expect(k8sClient.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	})).To(Succeed())
}

func newRestore(ns, name, series, version, pvc string) *backupv1alpha1.RestoreJob {
	rj := &backupv1alpha1.RestoreJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: backupv1alpha1.RestoreJobSpec{
			SeriesRef: backupv1alpha1.LocalObjectReference{Name: series},
			Version:   version,
			TargetPVC: backupv1alpha1.PVCTarget{ClaimName: pvc},
		},
	}
	Expect(k8sClient.Create(ctx, rj)).To(Succeed())
	return rj
}

func sameTree(a, b string) {
	err := filepath.Walk(a, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(b, rel))
		Expect(err).NotTo(HaveOccurred(), "restored tree lacks %s", rel)
		Expect(bytes.Equal(got, want)).To(BeTrue(), "%s differs after restore", rel)
		return nil
	})
	Expect(err).NotTo(HaveOccurred())
}

var _ = Describe("RestoreJob", func() {
	BeforeEach(requireWorkers)

	var ns, node string
	var v1, v2 string

	BeforeEach(func() {
		ns = newNamespace("rst")
		bs := placedSeries(pvcSeries(ns, "db"))
		node = bs.Status.Worker.Node
		v1 = randomTree(256)
		push(ns, "db", node, v1, "--time", "2025-01-01T00:00:00Z")
		v2 = randomTree(256)
		push(ns, "db", node, v2, "--time", "2025-01-02T00:00:00Z")
		Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(2))
		makePVC(ns, "restored")
	})

	It("restores a version with a Job and reports throughput and speed factor", func() {
		rj := newRestore(ns, "r1", "db", "1", "restored")
		var st backupv1alpha1.RestoreJobStatus
		Eventually(func(g Gomega) {
			st = getRestore(ns, "r1").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreRunning))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(st.ResolvedVersion).To(BeEquivalentTo(1))
		Expect(st.Worker).To(Equal(node))
		Expect(st.Progress).To(Equal("0%"))
		Expect(st.TotalBytes).To(BeNumerically(">=", 256*1024))

		job := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: st.JobName}, job)).To(Succeed())
		Expect(metav1.IsControlledBy(job, rj)).To(BeTrue())
		c := job.Spec.Template.Spec.Containers[0]
		Expect(strings.Join(c.Args, " ")).To(Equal("--json --quiet pull --server http://revault-worker-ssd-" + node +
			".revault-system.svc:8420 --token-file /etc/revault/token --series " + ns + "/db --version 1 --cache auto --cache-mib 64 -o /data/"))
		vol := job.Spec.Template.Spec.Volumes[0]
		Expect(vol.PersistentVolumeClaim.ClaimName).To(Equal("restored"))
		Expect(vol.PersistentVolumeClaim.ReadOnly).To(BeFalse())

		into := GinkgoT().TempDir()
		out, ok := runJobPod(job, ns, node, into)
		Expect(ok).To(BeTrue(), out)
		sameTree(v1, into)
		before := metricValue("revault_operator_restores_total", "result=succeeded")
		finishJob(job, true, out)
		Eventually(func(g Gomega) {
			st = getRestore(ns, "r1").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreSucceeded))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(st.Progress).To(Equal("100%"))
		Expect(st.RestoredBytes).To(Equal(st.TotalBytes))
		Expect(st.Throughput).To(MatchRegexp(`^[0-9.]+ (B|KiB|MiB|GiB)/s$`))
		Expect(st.ThroughputBytesPerSecond).To(BeNumerically(">", 0))
		Expect(st.SpeedFactor).To(MatchRegexp(`^[0-9]+\.[0-9]{2}$`))
		Expect(st.ContainerReads).To(BeNumerically(">", 0))
		Expect(st.CompletionTime).NotTo(BeNil())
		complete := condition(st.Conditions, backupv1alpha1.ConditionComplete)
		Expect(complete.Status).To(Equal(metav1.ConditionTrue))
		Expect(complete.ObservedGeneration).To(Equal(rj.Generation))
		// The reconciler counts the restore right after its status write, which the test may see first.
		Eventually(func() float64 { return metricValue("revault_operator_restores_total", "result=succeeded") }).
			Should(Equal(before + 1))
		Eventually(func() []string { return eventReasons(rj) }).Should(ContainElements("PhaseRunning", "RestoreStarted", "PhaseSucceeded"))
	})

	It("resolves latest and a point in time once, when it starts", func() {
		newRestore(ns, "latest", "db", "latest", "restored")
		newRestore(ns, "at", "db", "2025-01-01T23:59:59+01:00", "restored")
		newRestore(ns, "before", "db", "2024-12-31T00:00:00Z", "restored")
		Eventually(func(g Gomega) {
			g.Expect(getRestore(ns, "latest").Status.ResolvedVersion).To(BeEquivalentTo(2))
			g.Expect(getRestore(ns, "at").Status.ResolvedVersion).To(BeEquivalentTo(1))
			st := getRestore(ns, "before").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreFailed))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionFailed).Message).To(Equal(
				"series " + ns + "/db has no version taken at or before 2024-12-31T00:00:00Z (the oldest, 1, is from 2025-01-01T00:00:00Z)"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// A newer backup does not change what "latest" meant for a running restore.
		push(ns, "db", node, randomTree(16))
		Consistently(func() int64 { return getRestore(ns, "latest").Status.ResolvedVersion }).
			WithTimeout(2 * time.Second).Should(BeEquivalentTo(2))
	})

	It("fails with a clear condition when the version does not exist", func() {
		newRestore(ns, "missing", "db", "99", "restored")
		Eventually(func(g Gomega) {
			st := getRestore(ns, "missing").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreFailed))
			c := condition(st.Conditions, backupv1alpha1.ConditionFailed)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal("VersionNotFound"))
			g.Expect(c.Message).To(Equal("series " + ns + "/db has no version 99 (latest is 2)"))
			g.Expect(st.JobName).To(BeEmpty())
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("fails when its BackupSeries never appears", func() {
		newRestore(ns, "orphan", "nope", "latest", "restored")
		Eventually(func(g Gomega) {
			st := getRestore(ns, "orphan").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestorePending))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionComplete).Reason).To(Equal("SeriesNotFound"))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			st := getRestore(ns, "orphan").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreFailed))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionFailed).Message).To(
				Equal("BackupSeries nope not found in namespace " + ns))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("waits for its target PVC", func() {
		newRestore(ns, "nopvc", "db", "latest", "later")
		Eventually(func(g Gomega) {
			st := getRestore(ns, "nopvc").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestorePending))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionComplete).Reason).To(Equal("TargetPVCNotFound"))
		}).Should(Succeed())
		makePVC(ns, "later")
		Eventually(func() backupv1alpha1.RestorePhase { return getRestore(ns, "nopvc").Status.Phase }).
			WithTimeout(30 * time.Second).Should(Equal(backupv1alpha1.RestoreRunning))
	})

	It("carries the worker's message when the restore pod fails", func() {
		newRestore(ns, "broken", "db", "2", "restored")
		var st backupv1alpha1.RestoreJobStatus
		Eventually(func(g Gomega) {
			st = getRestore(ns, "broken").Status
			g.Expect(st.JobName).NotTo(BeEmpty())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		job := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: st.JobName}, job)).To(Succeed())
		// The version goes away between resolution and the pull: the worker refuses the pull.
		_, err := adminClient(node).DeleteSeries(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		out, ok := runJobPod(job, ns, node, GinkgoT().TempDir())
		Expect(ok).To(BeFalse(), out)
		workerMsg := plan.ParseJobOutput(out).Error
		Expect(workerMsg).To(ContainSubstring(ns + "/db"))
		before := metricValue("revault_operator_restores_total", "result=failed")
		finishJob(job, false, out)
		Eventually(func(g Gomega) {
			st = getRestore(ns, "broken").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.RestoreFailed))
			c := condition(st.Conditions, backupv1alpha1.ConditionFailed)
			g.Expect(c.Reason).To(Equal("RestoreFailed"))
			g.Expect(c.Message).To(Equal(workerMsg))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() float64 { return metricValue("revault_operator_restores_total", "result=failed") }).
			Should(Equal(before + 1))
	})
})
