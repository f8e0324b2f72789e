package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// releaseCharts are the charts (NAME-VERSION) of the release's revisions, oldest first.
func releaseCharts() []string {
	GinkgoHelper()
	out, err := helm("history", releaseName, "--namespace", systemNS, "--output", "json")
	Expect(err).NotTo(HaveOccurred(), out)
	var revs []struct {
		Chart  string `json:"chart"`
		Status string `json:"status"`
	}
	Expect(json.Unmarshal([]byte(out), &revs)).To(Succeed(), out)
	charts := make([]string, len(revs))
	for i, r := range revs {
		charts[i] = r.Chart
	}
	Expect(revs).NotTo(BeEmpty())
	Expect(revs[len(revs)-1].Status).To(Equal("deployed"))
	return charts
}

// chartVersion is the version in a chart directory's Chart.yaml.
func chartVersion(dir string) string {
	GinkgoHelper()
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var c struct {
		Version string `json:"version"`
	}
	Expect(yaml.Unmarshal(raw, &c)).To(Succeed())
	Expect(c.Version).NotTo(BeEmpty())
	return c.Version
}

// watchTermination polls until pod is being deleted (or gone) and notes when it saw that.
type termination struct {
	mu         sync.Mutex
	at         time.Time
	stop, done chan struct{}
}

func watchTermination(pod *corev1.Pod) *termination {
	t := &termination{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(t.done)
		for {
			select {
			case <-t.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			p := &corev1.Pod{}
			err := k.Get(ctx, client.ObjectKeyFromObject(pod), p)
			if err != nil && !apierrors.IsNotFound(err) {
				continue
			}
			if err == nil && p.UID == pod.UID && p.DeletionTimestamp == nil {
				continue
			}
			t.mu.Lock()
			t.at = time.Now()
			t.mu.Unlock()
			return
		}
	}()
	return t
}

// result is when the pod was seen going (zero if never); the watch ends.
func (t *termination) result() time.Time {
	close(t.stop)
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.at
}

// 16. helm upgrade from the previous release's chart and images while backups run. hack/e2e.sh
// runs this scenario alone and first (the e2e group "upgrade"), on a new cluster where the
// suite installed the previous release (hack/previous-release.sh builds it from its commit).
func upgradeSpecs() {
	Describe("16. helm upgrade from the previous chart with backups running", Label("upgrade"), Ordered, func() {
		It("rolls the operator and the workers while a Job's backup and a streamed backup run; nothing is lost", func() {
			if !upgradeGroup() {
				Skip("scenario 16 runs in the e2e group \"upgrade\" (E2E_GROUP=upgrade), which starts from the previous release")
			}
			prevChart, curChart := mustEnv("E2E_PREVIOUS_CHART"), envOr("E2E_CHART", "../charts/revault")
			prevOperator, prevWorker := mustEnv("E2E_PREVIOUS_OPERATOR_IMAGE"), mustEnv("E2E_PREVIOUS_WORKER_IMAGE")
			prevVersion, curVersion := chartVersion(prevChart), chartVersion(curChart)
			Expect(curVersion).NotTo(Equal(prevVersion), "the chart's version must move on from the previous release's")
			ssdNode, hddNode := storageNode("ssd"), storageNode("hdd")

			By("the previous release runs: chart revault-" + prevVersion + ", its operator and workers")
			Expect(releaseCharts()).To(HaveExactElements("revault-" + prevVersion))
			Eventually(func(g Gomega) {
				expectOperatorRunning(g, prevOperator)
				expectPoolRunning(g, "ssd", prevWorker)
				expectPoolRunning(g, "hdd", prevWorker)
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

			ns := newNamespace("e2e-upgrade")
			By("the previous release backs up a PVC series on the hdd worker: version 1")
			createPVC(ns, "src")
			gen := genTree(ns, "src", 160, 6, 48<<20)
			sum1 := sumTree(ns, "src")
			Expect(sum1.Bytes).To(Equal(gen.Bytes))
			Expect(k.Create(ctx, newSeries(ns, "files", "src", backupv1alpha1.MediaHDD))).To(Succeed())
			Expect(waitSeriesReady(ns, "files").Status.Worker.Node).To(Equal(hddNode))
			v1 := *version(backupNow(ns, "files", "before", 1), 1)
			Expect(v1.LogicalBytes).To(Equal(sum1.Bytes))

			By("an external series on the ssd worker")
			Expect(k.Create(ctx, &backupv1alpha1.BackupSeries{
				ObjectMeta: metav1.ObjectMeta{Name: "stream", Namespace: ns},
				Spec: backupv1alpha1.BackupSeriesSpec{
					Source:  backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "e2e"}},
					Storage: backupv1alpha1.StorageSpec{Media: backupv1alpha1.MediaSSD},
				},
			})).To(Succeed())
			stream := waitSeriesReady(ns, "stream")
			Expect(stream.Status.Worker.Node).To(Equal(ssdNode))
			oldSSD, oldHDD := workerPod("ssd", ssdNode), workerPod("hdd", hddNode)
			mutate(ns, "src", 161, 2, 192<<20)
			sum2 := sumTree(ns, "src")
			m, err := workerMetrics("hdd", hddNode)
			Expect(err).NotTo(HaveOccurred())
			lr := slowJobs(ns)

			// Both backups start just before the upgrade. The stream outlasts the rollout: 12 MiB
			// at an even pace over 90 s on one connection, so the ssd worker is told to stop
			// while it streams (the rollout takes 20-40 s) and drains it (in-flight work may
			// run 100 s more). The Job's (240 MiB, ~10 s under the cap) streams to the hdd worker
			// when the upgrade starts, so the operator that started it is replaced while it runs.
			const size = 12 << 20
			By("backups running: 12 MiB streamed over 90 s to the ssd worker, and the changed tree's Job to the hdd worker")
			push := withToken(toolPod(ns, podName("slowpush"), "", "slowpush", "-server", stream.Status.Worker.Endpoint,
				"-series", ns+"/stream", "-bytes", strconv.Itoa(size), "-seconds", "90", "-seed", runSeed(162)))
			startPod(push)
			requestBackup(ns, "files", "during")
			Eventually(func(g Gomega) {
				calls := workerAPI(ns, stream.Status.Worker.Endpoint, "GET /v1/series/"+ns+"/stream/backup")
				g.Expect(calls[0].Status).To(Equal(200), calls[0].Body)
				g.Expect(calls[0].Body).To(ContainSubstring(`"running":true`))
			}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
			ssdGone := watchTermination(oldSSD)
			waitStreaming("hdd", hddNode, m["revault_received_bytes_total"])

			By("helm upgrade to chart revault-" + curVersion + " with this build's images")
			t0 := time.Now()
			out, err := installRelease(curChart, workerImage, operatorImage)
			Expect(err).NotTo(HaveOccurred(), "helm: %s", out)
			helmTook := time.Since(t0)
			Expect(k.Delete(ctx, lr)).To(Succeed())
			Expect(releaseCharts()).To(HaveExactElements("revault-"+prevVersion, "revault-"+curVersion))

			By("the operator and both pools roll out the new images")
			Eventually(func(g Gomega) {
				expectOperatorRunning(g, operatorImage)
				expectPoolRunning(g, "ssd", workerImage)
				expectPoolRunning(g, "hdd", workerImage)
			}).WithTimeout(backupTimeout).WithPolling(poll).Should(Succeed())
			GinkgoWriter.Printf("upgrade: helm returned after %s; every pod rolled after %s\n",
				helmTook.Round(time.Second), time.Since(t0).Round(time.Second))
			newSSD := workerPod("ssd", ssdNode)
			Expect(newSSD.UID).NotTo(Equal(oldSSD.UID))
			Expect(workerPod("hdd", hddNode).UID).NotTo(Equal(oldHDD.UID))

			By("the stream committed on the ssd worker that was told to stop while it ran")
			res := committedStream(push, size)
			answered, err := time.Parse(time.RFC3339Nano, res.Answered)
			Expect(err).NotTo(HaveOccurred())
			stopping := ssdGone.result()
			Expect(stopping).NotTo(BeZero(), "the old ssd worker pod %s never went", oldSSD.Name)
			Expect(stopping.Before(answered)).To(BeTrue(),
				"the ssd worker was told to stop at %s, after the stream committed at %s: the upgrade was not mid-backup",
				stopping.Format(time.RFC3339Nano), res.Answered)
			GinkgoWriter.Printf("upgrade: the ssd worker was told to stop %s after helm upgrade began and %s before "+
				"the stream committed (version %d, read back in %d tries)\n", stopping.Sub(t0).Round(time.Second),
				answered.Sub(stopping).Round(time.Second), res.Version, res.ReadTries)

			By("the new ssd worker pod serves the streamed version byte-exact")
			var again toolresult.ReadBack
			tool(withToken(toolPod(ns, podName("readback"), "", "readback", "-server", stream.Status.Worker.Endpoint,
				"-series", ns+"/stream", "-version", strconv.FormatInt(res.Version, 10))), &again)
			Expect(again.Restored).To(Equal(res.Sent))
			Expect(workerPod("ssd", ssdNode).UID).To(Equal(newSSD.UID), "read from the new pod")
			Eventually(func(g Gomega) {
				g.Expect(versionNumbers(getSeries(ns, "stream"))).To(Equal([]int64{res.Version}))
			}).WithTimeout(2 * time.Minute).WithPolling(poll).Should(Succeed())

			By("the Job's backup ends as version 2 of the changed tree, and version 1 is as it was")
			bs := waitVersion(ns, "files", 2)
			Expect(versionNumbers(bs)).To(Equal([]int64{1, 2}))
			Expect(version(bs, 2).LogicalBytes).To(Equal(sum2.Bytes))
			kept := version(bs, 1)
			Expect(kept.LogicalBytes).To(Equal(v1.LogicalBytes))
			Expect(kept.Time.Equal(&v1.Time)).To(BeTrue(), "version 1's time changed: %v, was %v", kept.Time, v1.Time)
			jobs := backupJobs(ns, "files")
			Expect(jobs).To(HaveLen(2))
			for _, j := range jobs {
				Expect(j.Status.Succeeded).To(Equal(int32(1)), "Job %s", j.Name)
			}

			By("the new release restores the version the previous one took, and the one taken during the upgrade, byte-exact")
			expectRestore(ns, "restore-1", "files", "1", 1, sum1, "version 1 (previous release)")
			expectRestore(ns, "restore-2", "files", "latest", 2, sum2, "version 2 (during the upgrade)")
		})
	})
}
