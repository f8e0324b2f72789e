package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// One top-level container with the scenarios in the order. Ginkgo still shuffles the
// Ordered containers (CI on 2026-11-29 ran 14 first and 7b after 13), so every scenario leaves
// the workers, the spare node and the S3 server as it found them. Each scenario has its own
// namespace; 2-5 build on each other (Ordered: a failure skips the rest of that scenario only).
var _ = Describe("Revault on a 4-node kind cluster", func() {
	installSpecs()
	seriesSpecs()
	badInputSpecs()
	workerKillSpecs()
	operatorRestartSpecs()
	isolationSpecs()
	deletionSpecs()
	tlsRotationSpecs()
	fiftySeriesSpecs()
	diskFullSpecs()
	remoteOutageSpecs()
	lostNodeSpecs()
	drainSpecs()
	upgradeSpecs()
})

// 1. Install with Helm; the operator becomes Ready; worker pods run on both labelled nodes.
func installSpecs() {
	Describe("1. helm install", func() {
		It("runs the operator and one ready worker per labelled node, each behind its own Service", func() {
			By("the Helm release is deployed")
			out, err := helm("status", releaseName, "--namespace", systemNS, "--output", "json")
			Expect(err).NotTo(HaveOccurred(), out)
			var rel struct {
				Info struct {
					Status string `json:"status"`
				} `json:"info"`
			}
			Expect(json.Unmarshal([]byte(out), &rel)).To(Succeed())
			Expect(rel.Info.Status).To(Equal("deployed"))

			By("the operator Deployment is available, running the loaded image")
			Eventually(func(g Gomega) { expectOperatorRunning(g, operatorImage) }).
				WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

			By("the CRDs serve all three kinds")
			Expect(k.List(ctx, &backupv1alpha1.BackupSeriesList{})).To(Succeed())
			Expect(k.List(ctx, &backupv1alpha1.RetentionPolicyList{})).To(Succeed())
			Expect(k.List(ctx, &backupv1alpha1.RestoreJobList{})).To(Succeed())

			for _, media := range []string{"ssd", "hdd"} {
				node := storageNode(media)
				By(fmt.Sprintf("the %s pool: DaemonSet revault-worker-%s has one ready pod, on %s", media, media, node))
				Eventually(func(g Gomega) { expectPoolRunning(g, media, workerImage) }).
					WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
				pod := workerPod(media, node)
				Expect(pod.Labels).To(HaveKeyWithValue("revault.io/node", node), "the operator labels worker pods with their node")

				By("it answers /readyz and has loaded the operator's token, through its per-node Service")
				Eventually(func(g Gomega) {
					body, err := cs.CoreV1().Services(systemNS).ProxyGet("https", workerService(media, node), "8420", "/readyz", nil).DoRaw(ctx)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(string(body)).To(Equal("ready\n"))
					m, err := workerMetrics(media, node)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(m["revault_tokens"]).To(BeNumerically(">=", 1))
				}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
			}
		})
	})
}

// 2-5. A PVC series: back up, change, back up, restore two versions, apply retention.
func seriesSpecs() {
	Describe("2-5. a series of a PVC", Ordered, func() {
		const series, src = "data", "src"
		var (
			ns         string
			gen        toolresult.Gen
			mut        toolresult.Mutate
			sum1, sum2 toolresult.Sum
			v1, v2     backupv1alpha1.BackupVersion
			node       string
		)

		BeforeAll(func() {
			ns = newNamespace("e2e-series")
			createPVC(ns, src)
			By("filling PVC src with a generated tree (24 random files, 48 MiB, and special entries)")
			gen = genTree(ns, src, 1, 24, 48<<20)
			sum1 = sumTree(ns, src)
			Expect(sum1.Bytes).To(Equal(gen.Bytes))
			Expect(k.Create(ctx, newSeries(ns, series, src, backupv1alpha1.MediaSSD))).To(Succeed())
			bs := waitSeriesReady(ns, series)
			node = bs.Status.Worker.Node
		})

		It("2. backs up on revault.io/backup-now: version 1 appears in status with logical and stored bytes", func() {
			bs := backupNow(ns, series, "first", 1)
			st := bs.Status
			Expect(st.Worker.Media).To(Equal(backupv1alpha1.MediaSSD))
			Expect(st.Worker.Node).To(Equal(storageNode("ssd")))
			Expect(st.Worker.Endpoint).To(Equal(workerEndpoint("ssd", node)))
			Expect(st.LastBackupNow).To(Equal("first"))
			Expect(st.LastJob).NotTo(BeNil())
			Expect(st.LastJob.Succeeded).To(BeTrue())
			Expect(condition(st.Conditions, backupv1alpha1.ConditionBackupSucceeded).Status).To(Equal(metav1.ConditionTrue))
			Expect(condition(st.Conditions, backupv1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
			Expect(st.VersionCount).To(Equal(int32(1)))
			Expect(versionNumbers(bs)).To(Equal([]int64{1}))
			v1 = *version(bs, 1)
			// Logical bytes are the file contents backed up: exactly what the generator wrote.
			Expect(v1.LogicalBytes).To(Equal(gen.Bytes))
			// Random contents do not compress or dedup: stored ~ logical (plus container headers).
			Expect(v1.StoredBytes).To(BeNumerically(">=", gen.Bytes*9/10))
			Expect(v1.StoredBytes).To(BeNumerically("<=", gen.Bytes*105/100))
			Expect(st.LogicalBytes).To(Equal(v1.LogicalBytes))
			Expect(st.StoredBytes).To(Equal(v1.StoredBytes))
			Expect(st.DedupRatio).NotTo(BeEmpty())
			GinkgoWriter.Printf("version 1: logical %s, stored %s\n", mib(v1.LogicalBytes), mib(v1.StoredBytes))
		})

		It("3. backs up a changed tree: version 2's stored bytes are about the change", func() {
			By("rewriting 3 files and adding a 4 MiB file in src")
			tool(toolPod(ns, podName("mutate"), src, "mutate", "-dir", "/data", "-seed", runSeed(2), "-rewrite", "3",
				"-add", fmt.Sprint(4<<20)), &mut)
			sum2 = sumTree(ns, src)
			Expect(sum2.Digest).NotTo(Equal(sum1.Digest))
			change := mut.RewrittenBytes + mut.AddedBytes

			bs := backupNow(ns, series, "second", 2)
			Expect(versionNumbers(bs)).To(Equal([]int64{1, 2}))
			v2 = *version(bs, 2)
			Expect(v2.LogicalBytes).To(Equal(sum2.Bytes))
			GinkgoWriter.Printf("change %s; version 2: logical %s, new %s, stored %s\n",
				mib(change), mib(v2.LogicalBytes), mib(v2.NewBytes), mib(v2.StoredBytes))
			// The new contents must be stored; the unchanged rest must not be stored again. Segment
			// dedup also re-stores the unchanged neighbours of a changed file inside its segments.
			Expect(v2.StoredBytes).To(BeNumerically(">=", change*9/10))
			Expect(v2.StoredBytes).To(BeNumerically("<=", change*5/2))
			Expect(v2.StoredBytes).To(BeNumerically("<", v1.StoredBytes/2))
			Expect(bs.Status.StoredBytes).To(Equal(v1.StoredBytes + v2.StoredBytes))
			Expect(bs.Status.LogicalBytes).To(Equal(v1.LogicalBytes + v2.LogicalBytes))
		})

		It("4. restores version 1 and latest into new PVCs byte-exact", func() {
			rj := expectRestore(ns, "restore-v1", series, "1", 1, sum1, "version 1")
			Expect(rj.Status.TotalBytes).To(Equal(v1.LogicalBytes))
			expectRestore(ns, "restore-latest", series, "latest", 2, sum2, "latest (version 2)")
		})

		It("5. a RetentionPolicy with keepVersions 1 removes version 1 and the worker's stored bytes drop", func() {
			before := storedBytes("ssd", node)
			rp := &backupv1alpha1.RetentionPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "keep-one", Namespace: ns},
				Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(1))},
			}
			Expect(k.Create(ctx, rp)).To(Succeed())
			bs := getSeries(ns, series)
			patch := client.MergeFrom(bs.DeepCopy())
			bs.Spec.RetentionPolicyRef = &backupv1alpha1.LocalObjectReference{Name: "keep-one"}
			Expect(k.Patch(ctx, bs, patch)).To(Succeed())

			By("version 1 disappears from the series' status")
			Eventually(func(g Gomega) {
				bs := getSeries(ns, series)
				g.Expect(versionNumbers(bs)).To(Equal([]int64{2}))
				g.Expect(bs.Status.VersionCount).To(Equal(int32(1)))
				g.Expect(bs.Status.LatestVersion).To(Equal(int64(2)))
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

			By("the policy reports what it expired and reclaimed")
			Eventually(func(g Gomega) {
				g.Expect(k.Get(ctx, client.ObjectKeyFromObject(rp), rp)).To(Succeed())
				c := condition(rp.Status.Conditions, backupv1alpha1.ConditionApplied)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
				g.Expect(rp.Status.Series).To(HaveLen(1))
				g.Expect(rp.Status.Series[0].LastExpired).To(Equal([]int64{1}))
				g.Expect(rp.Status.BytesReclaimed).To(BeNumerically(">", 0))
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

			By("the worker's stored bytes drop by at least the contents only version 1 had")
			after := storedBytes("ssd", node)
			GinkgoWriter.Printf("worker stored bytes %s -> %s (version 1 alone held %s of old contents)\n",
				mib(before), mib(after), mib(mut.RewrittenBytes))
			Expect(after).To(BeNumerically("<", before))
			Expect(before - after).To(BeNumerically(">=", mut.RewrittenBytes*9/10))

			By("the kept version still restores byte-exact after the slide and expiry")
			expectRestore(ns, "restore-after-retention", series, "latest", 2, sum2, "version 2 after retention")
		})
	})
}

// 6. Bad input: the API server rejects invalid objects with the CEL messages; a RestoreJob of a
// missing version ends Failed with a clear condition.
func badInputSpecs() {
	Describe("6. bad input", Ordered, func() {
		var ns string
		BeforeAll(func() {
			ns = newNamespace("e2e-bad")
			createPVC(ns, "src")
			genTree(ns, "src", 6, 2, 1<<20)
			Expect(k.Create(ctx, newSeries(ns, "good", "src", backupv1alpha1.MediaSSD))).To(Succeed())
			waitSeriesReady(ns, "good")
			backupNow(ns, "good", "1", 1)
		})

		It("rejects invalid BackupSeries, RetentionPolicies and RestoreJobs with the CEL messages", func() {
			both := newSeries(ns, "both", "src", backupv1alpha1.MediaSSD)
			both.Spec.Source.External = &backupv1alpha1.ExternalSource{Producer: "velero"}
			expectInvalid(k.Create(ctx, both), "exactly one of source.pvc or source.external must be set")

			neither := newSeries(ns, "neither", "src", backupv1alpha1.MediaSSD)
			neither.Spec.Source.PVC = nil
			expectInvalid(k.Create(ctx, neither), "exactly one of source.pvc or source.external must be set")

			badCron := newSeries(ns, "bad-cron", "src", backupv1alpha1.MediaSSD)
			badCron.Spec.Schedule = "every night"
			expectInvalid(k.Create(ctx, badCron), `schedule must be a cron schedule of five fields (e.g. "0 2 * * *") or @hourly/@daily/@weekly/@monthly/@yearly`)

			extSched := newSeries(ns, "ext-sched", "", backupv1alpha1.MediaSSD)
			extSched.Spec.Source = backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{}}
			extSched.Spec.Schedule = "@daily"
			expectInvalid(k.Create(ctx, extSched), "schedule applies to pvc sources only: external series are pushed by their producer")

			for _, name := range []string{"both", "neither", "bad-cron", "ext-sched"} {
				err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &backupv1alpha1.BackupSeries{})
				Expect(client.IgnoreNotFound(err)).To(Succeed())
				Expect(err).To(HaveOccurred(), "rejected BackupSeries %s exists", name)
			}

			By("fields fixed at creation cannot change")
			good := getSeries(ns, "good")
			changed := good.DeepCopy()
			changed.Spec.Dedup.Unit = backupv1alpha1.DedupChunk
			expectInvalid(k.Update(ctx, changed), "dedup.unit is fixed when the series is created")
			changed = good.DeepCopy()
			changed.Spec.Storage.Media = backupv1alpha1.MediaHDD
			expectInvalid(k.Update(ctx, changed), "storage.media cannot change: the series' data lives on its worker")

			rp := &backupv1alpha1.RetentionPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "live-over-keep", Namespace: ns},
				Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(1)), LiveVersions: ptr.To(int32(3))},
			}
			expectInvalid(k.Create(ctx, rp), "liveVersions must not exceed keepVersions")
			expectInvalid(k.Create(ctx, &backupv1alpha1.RetentionPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "keeps-nothing", Namespace: ns},
			}), "set at least one of keepVersions, keepWithin, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly")

			badVersion := &backupv1alpha1.RestoreJob{
				ObjectMeta: metav1.ObjectMeta{Name: "bad-version", Namespace: ns},
				Spec: backupv1alpha1.RestoreJobSpec{SeriesRef: backupv1alpha1.LocalObjectReference{Name: "good"},
					Version: "yesterday", TargetPVC: backupv1alpha1.PVCTarget{ClaimName: "x"}},
			}
			expectInvalid(k.Create(ctx, badVersion), `version must be a version number, "latest", or an RFC 3339 time`)
		})

		It("fails a RestoreJob of a missing version with a Failed condition naming the version", func() {
			createPVC(ns, "target")
			rj := &backupv1alpha1.RestoreJob{
				ObjectMeta: metav1.ObjectMeta{Name: "missing-version", Namespace: ns},
				Spec: backupv1alpha1.RestoreJobSpec{SeriesRef: backupv1alpha1.LocalObjectReference{Name: "good"},
					Version: "99", TargetPVC: backupv1alpha1.PVCTarget{ClaimName: "target"}},
			}
			Expect(k.Create(ctx, rj)).To(Succeed())
			rj = waitRestoreDone(ns, rj.Name)
			Expect(rj.Status.Phase).To(Equal(backupv1alpha1.RestoreFailed))
			want := fmt.Sprintf("series %s/good has no version 99 (latest is 1)", ns)
			failed := condition(rj.Status.Conditions, backupv1alpha1.ConditionFailed)
			Expect(failed).NotTo(BeNil())
			Expect(failed.Status).To(Equal(metav1.ConditionTrue))
			Expect(failed.Reason).To(Equal("VersionNotFound"))
			Expect(failed.Message).To(Equal(want))
			complete := condition(rj.Status.Conditions, backupv1alpha1.ConditionComplete)
			Expect(complete).NotTo(BeNil())
			Expect(complete.Status).To(Equal(metav1.ConditionFalse))
			Expect(rj.Status.JobName).To(BeEmpty(), "no restore Job runs for a missing version")
			Expect(eventReasons(events(ns, rj.Name))).To(ContainElement("PhaseFailed"))
		})
	})
}

// 7. A worker pod killed mid-backup: the Job retries, the series ends with one complete
// version, and its restore is byte-exact.
func workerKillSpecs() {
	Describe("7. a worker pod killed mid-backup", Ordered, func() {
		const series, src = "big", "src"
		var (
			ns   string
			sum0 toolresult.Sum
			node string
		)
		BeforeAll(func() {
			ns = newNamespace("e2e-kill")
			createPVC(ns, src)
			gen := genTree(ns, src, 7, 12, 384<<20)
			sum0 = sumTree(ns, src)
			Expect(sum0.Bytes).To(Equal(gen.Bytes))
			Expect(k.Create(ctx, newSeries(ns, series, src, backupv1alpha1.MediaHDD))).To(Succeed())
			bs := waitSeriesReady(ns, series)
			node = bs.Status.Worker.Node
			Expect(node).To(Equal(storageNode("hdd")))
		})

		It("retries the backup Job and ends with one complete version that restores byte-exact", func() {
			old := workerPod("hdd", node)
			m, err := workerMetrics("hdd", node)
			Expect(err).NotTo(HaveOccurred())
			received0 := m["revault_received_bytes_total"]

			// A slow client makes "mid-backup" a wide window: the stream lasts ~15 s, well beyond
			// the ~1 s it takes to see it on the worker and the ~2 s the kubelet takes to kill a
			// pod deleted with grace period 0.
			lr := slowJobs(ns)
			requestBackup(ns, series, "killed")

			By("waiting until the worker receives the backup stream")
			waitStreaming("hdd", node, received0)

			By("killing worker pod " + old.Name + " (deleted with grace period 0)")
			Expect(k.Delete(ctx, old, client.GracePeriodSeconds(0))).To(Succeed())
			Expect(k.Delete(ctx, lr)).To(Succeed()) // the retry runs at full speed
			Eventually(func(g Gomega) {
				g.Expect(workerPod("hdd", node).Name).NotTo(Equal(old.Name))
			}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())

			By("the Job retries and the series ends with exactly one complete version")
			bs := waitVersion(ns, series, 1)
			Expect(bs.Status.VersionCount).To(Equal(int32(1)), "the interrupted attempt must leave no version")
			Expect(version(bs, 1).LogicalBytes).To(Equal(sum0.Bytes))
			Expect(bs.Status.Worker.Pod).NotTo(Equal(old.Name))
			jobs := backupJobs(ns, series)
			Expect(jobs).To(HaveLen(1))
			Expect(jobs[0].Status.Succeeded).To(Equal(int32(1)))
			Expect(jobs[0].Status.Failed).To(BeNumerically(">=", 1), "the attempt cut by the kill failed")

			By("the failed attempt's pod reports the broken stream")
			var pods corev1.PodList
			Expect(k.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"job-name": jobs[0].Name})).To(Succeed())
			var messages []string
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodFailed {
					for _, c := range p.Status.ContainerStatuses {
						if t := c.State.Terminated; t != nil {
							messages = append(messages, t.Message)
						}
					}
				}
			}
			Expect(messages).NotTo(BeEmpty())
			Expect(strings.Join(messages, "\n")).To(ContainSubstring("error"))
			GinkgoWriter.Printf("failed attempt: %s\n", strings.Join(messages, " | "))

			By("restoring the version byte-exact")
			expectRestore(ns, "restore", series, "latest", 1, sum0, "version 1 after the kill")
		})
	})
}

// 8. Two series in different namespaces (same name, same worker) cannot read each other's data
// through the worker API.
func isolationSpecs() {
	Describe("8. namespace isolation on a shared worker", Ordered, func() {
		const series = "app"
		var nsA, nsB string
		var bsA, bsB *backupv1alpha1.BackupSeries
		BeforeAll(func() {
			nsA, nsB = newNamespace("e2e-iso-a"), newNamespace("e2e-iso-b")
			for i, ns := range []string{nsA, nsB} {
				createPVC(ns, "src")
				genTree(ns, "src", 80+i, 3, 2<<20)
				Expect(k.Create(ctx, newSeries(ns, series, "src", backupv1alpha1.MediaSSD))).To(Succeed())
			}
			for _, ns := range []string{nsA, nsB} {
				waitSeriesReady(ns, series)
			}
			bsA = backupNow(nsA, series, "1", 1)
			bsB = backupNow(nsB, series, "1", 1)
			Expect(bsA.Status.Worker.Endpoint).To(Equal(bsB.Status.Worker.Endpoint), "both series share the ssd worker")
		})

		It("a namespace's token cannot read, write or delete another namespace's series", func() {
			a := "/v1/series/" + nsA + "/" + series
			reqs := []string{
				"GET " + a, "GET " + a + "/versions", "GET " + a + "/versions/1", "PUT " + a + "/versions",
				"DELETE " + a, "DELETE " + a + "/versions/1", "PUT " + a + "/retention",
				"GET /v1/series/" + nsA + "/no-such-series", "GET /v1/stats",
				"GET /v1/series", "GET /v1/series/" + nsB + "/" + series,
			}
			calls := workerAPI(nsB, bsB.Status.Worker.Endpoint, reqs...)
			for _, c := range calls[:9] {
				Expect(c.Status).To(Equal(403), "%s with %s's token: %d %s", c.Request, nsB, c.Status, c.Body)
				Expect(c.Code).To(Equal("forbidden"))
			}
			list := calls[9]
			Expect(list.Status).To(Equal(200))
			Expect(list.Body).To(ContainSubstring(`"` + nsB + "/" + series + `"`))
			Expect(list.Body).NotTo(ContainSubstring(nsA))
			Expect(calls[10].Status).To(Equal(200), "the token works for its own namespace: %s", calls[10].Body)

			By("revault pull of the other namespace's series fails with 403")
			pod := withToken(rootPod(nsB, podName("pull"), "", workerImage, "revault", "--json", "--quiet", "pull",
				"--server", bsB.Status.Worker.Endpoint, "--token-file", "/etc/revault/token", "--ca-cert", "/etc/revault/ca.crt",
				"--series", nsA+"/"+series, "--version", "1", "-o", "/tmp/out/"))
			logs, phase := runPod(pod)
			Expect(phase).To(Equal(corev1.PodFailed), logs)
			Expect(logs).To(ContainSubstring("forbidden"))

			By("the other namespace's series is intact")
			own := workerAPI(nsA, bsA.Status.Worker.Endpoint, "GET "+a)
			Expect(own[0].Status).To(Equal(200), own[0].Body)
			Expect(own[0].Body).To(ContainSubstring(`"versions":1`))
		})

		It("a namespace at its revault.io/quota: its series say so, and the shared worker refuses its uploads only", func() {
			setNamespaceQuota(nsB, "1")
			DeferCleanup(func() { setNamespaceQuota(nsB, "") })
			Eventually(func(g Gomega) {
				c := condition(getSeries(nsB, series).Status.Conditions, backupv1alpha1.ConditionQuotaExceeded)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
				g.Expect(c.Reason).To(Equal("OverQuota"))
			}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
			// The operator writes the quota into the workers' token Secret; the kubelet
			// refreshes the mounted file within about a minute, and the worker re-reads it.
			probe := "PUT /v1/series/" + nsB + "/quota-probe/versions"
			Eventually(func(g Gomega) {
				c := workerAPI(nsB, bsB.Status.Worker.Endpoint, probe)[0]
				g.Expect(c.Status).To(Equal(403), "%s: %s", probe, c.Body)
				g.Expect(c.Code).To(Equal("quota_exceeded"))
				g.Expect(c.Body).To(ContainSubstring("namespace " + nsB + " holds"))
			}).WithTimeout(3 * time.Minute).WithPolling(5 * time.Second).Should(Succeed())
			c := workerAPI(nsA, bsA.Status.Worker.Endpoint, "PUT /v1/series/"+nsA+"/quota-probe/versions")[0]
			Expect(c.Status).To(Equal(201), "a namespace without a quota: %s", c.Body)
		})
	})
}

// setNamespaceQuota sets (or, with "", removes) the revault.io/quota annotation of ns.
func setNamespaceQuota(ns, quota string) {
	GinkgoHelper()
	Eventually(func() error {
		cur := &corev1.Namespace{}
		if err := k.Get(ctx, client.ObjectKey{Name: ns}, cur); err != nil {
			return err
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		if quota == "" {
			delete(cur.Annotations, backupv1alpha1.QuotaAnnotation)
		} else {
			cur.Annotations[backupv1alpha1.QuotaAnnotation] = quota
		}
		return k.Update(ctx, cur)
	}).Should(Succeed())
}

// 9. Deleting a BackupSeries with deletionPolicy: Delete removes its data from the worker.
func deletionSpecs() {
	Describe("9. deletionPolicy Delete", Ordered, func() {
		const series = "doomed"
		var ns string
		var bs *backupv1alpha1.BackupSeries
		BeforeAll(func() {
			ns = newNamespace("e2e-delete")
			createPVC(ns, "src")
			genTree(ns, "src", 9, 4, 24<<20)
			s := newSeries(ns, series, "src", backupv1alpha1.MediaSSD)
			s.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			Expect(k.Create(ctx, s)).To(Succeed())
			waitSeriesReady(ns, series)
			bs = backupNow(ns, series, "1", 1)
		})

		It("removes every version and frees its bytes on the worker", func() {
			w := bs.Status.Worker
			path := "/v1/series/" + ns + "/" + series
			probe := func() []toolresult.APICall { return workerAPI(ns, w.Endpoint, "GET "+path, "GET "+path+"/versions/1") }
			calls := probe()
			Expect(calls[0].Status).To(Equal(200), "before: %s", calls[0].Body)
			Expect(calls[0].Body).To(ContainSubstring(`"versions":1`))
			Expect(calls[1].Status).To(Equal(200))
			before := storedBytes(string(w.Media), w.Node)

			Expect(k.Delete(ctx, bs)).To(Succeed())
			Eventually(func(g Gomega) {
				err := k.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{})
				g.Expect(err).To(HaveOccurred())
				g.Expect(client.IgnoreNotFound(err)).To(Succeed())
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
			Expect(eventReasons(events(ns, series))).To(ContainElement("SeriesDeleted"))

			By("the worker holds no version of the series any more")
			// The worker keeps the series' record (never its data): version numbers are never
			// reused, and a BackupSeries recreated under the name is placed on this worker.
			calls = probe()
			Expect(calls[0].Status).To(Equal(200), calls[0].Body)
			Expect(calls[0].Body).To(ContainSubstring(`"versions":0`))
			Expect(calls[0].Body).To(ContainSubstring(`"logicalBytes":0`))
			Expect(calls[1].Status).To(Equal(404), calls[1].Body)
			Expect(calls[1].Code).To(Equal("unknown_version"))

			By("its containers are gone from the worker's disk")
			after := storedBytes(string(w.Media), w.Node)
			stored := version(bs, 1).StoredBytes
			GinkgoWriter.Printf("worker stored bytes %s -> %s (the series stored %s)\n", mib(before), mib(after), mib(stored))
			Expect(before - after).To(BeNumerically(">=", stored*9/10))

			By("a new BackupSeries of the same name works, even with another dedup unit")
			s := newSeries(ns, series, "src", backupv1alpha1.MediaSSD)
			s.Spec.Dedup.Unit = backupv1alpha1.DedupChunk
			Expect(k.Create(ctx, s)).To(Succeed())
			again := waitSeriesReady(ns, series)
			Expect(again.Status.Worker.Node).To(Equal(w.Node))
			// Placed says "Adopted" until the next reconcile; the event stays.
			Expect(eventReasons(events(ns, series))).To(ContainElement("Adopted"),
				"the new series is placed on the worker that kept the series' record")
			again = backupNow(ns, series, "again", 2)
			Expect(versionNumbers(again)).To(Equal([]int64{2}))
			calls = probe()
			Expect(calls[0].Body).To(ContainSubstring(`"unit":"chunk"`))
		})
	})
}
