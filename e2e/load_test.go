package e2e

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// slotsPerWorker is the workers' default number of backups at once (revault serve
// --max-backups; the suite does not change it).
const slotsPerWorker = 4

// nextMinuteAfter is the first whole minute (UTC) at least lead from now: a schedule for it is
// in place before it fires.
func nextMinuteAfter(lead time.Duration) time.Time {
	return time.Now().UTC().Add(lead).Truncate(time.Minute).Add(time.Minute)
}

// workerLoad is what the sampling saw of one worker: the most backups it ran and held back at
// once.
type workerLoad struct{ inflight, queued float64 }

// 13. Fifty series on the two workers, scheduled for the same minute, as nightly backups at
// 02:00 are. Every series gets its version, no worker runs more backups than it has slots (the
// rest wait their turn on the worker), and the versions restore byte-exact.
func fiftySeriesSpecs() {
	Describe("13. fifty series scheduled at once", Ordered, func() {
		It("backs up every series once, at most four at a time per worker, and the versions restore", func() {
			const n = 50
			ns := newNamespace("e2e-fifty")
			createPVC(ns, "src")
			gen := genTree(ns, "src", 131, 16, 128<<20)
			sum0 := sumTree(ns, "src")
			Expect(sum0.Bytes).To(Equal(gen.Bytes))

			By("creating fifty series of one PVC, half on the ssd worker and half on the hdd worker")
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("s%02d", i)
				media := backupv1alpha1.MediaSSD
				if i%2 == 1 {
					media = backupv1alpha1.MediaHDD
				}
				Expect(k.Create(ctx, newSeries(ns, names[i], "src", media))).To(Succeed())
			}
			nodes := map[string]string{}
			for _, name := range names {
				bs := waitSeriesReady(ns, name)
				nodes[string(bs.Status.Worker.Media)] = bs.Status.Worker.Node
			}
			Expect(nodes).To(HaveLen(2))

			// Job pods capped at 25 millicores (as in 7): each push of the 128 MiB tree lasts
			// seconds, so the fifty overlap and the workers' slots fill.
			lr := slowJobs(ns)
			fire := nextMinuteAfter(20 * time.Second)
			schedule := fmt.Sprintf("%d %d * * *", fire.Minute(), fire.Hour())
			By(fmt.Sprintf("scheduling all fifty for %s UTC (%q)", fire.Format(time.TimeOnly), schedule))
			for _, name := range names {
				bs := getSeries(ns, name)
				patch := client.MergeFrom(bs.DeepCopy())
				bs.Spec.Schedule = schedule
				Expect(k.Patch(ctx, bs, patch)).To(Succeed())
			}

			By("sampling the workers' backup gauges until every series reports its version")
			load := map[string]*workerLoad{"ssd": {}, "hdd": {}}
			done := 0
			deadline := fire.Add(backupTimeout)
			for done < n {
				Expect(time.Now().Before(deadline)).To(BeTrue(),
					"%d of %d series have their version %s after the schedule fired", done, n, backupTimeout)
				for media, node := range nodes {
					if m, err := workerMetrics(media, node); err == nil {
						load[media].inflight = max(load[media].inflight, m["revault_inflight_backups"])
						load[media].queued = max(load[media].queued, m["revault_queued_backups"])
					}
				}
				var list backupv1alpha1.BackupSeriesList
				Expect(k.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
				done = 0
				for _, bs := range list.Items {
					if lj := bs.Status.LastJob; lj != nil && !lj.Succeeded {
						media, node := "", ""
						if w := bs.Status.Worker; w != nil {
							media, node = string(w.Media), w.Node
						}
						Fail(fmt.Sprintf("series %s: backup Job %s failed: %s%s", bs.Name, lj.Name, lj.Message,
							jobAttempts(ns, lj.Name, bs.Name, media, node)))
					}
					if bs.Status.LatestVersion >= 1 && bs.Status.Phase == backupv1alpha1.SeriesReady {
						done++
					}
				}
				time.Sleep(time.Second)
			}
			Expect(k.Delete(ctx, lr)).To(Succeed())
			// A retried pod is no failure of the scenario, but it is worth knowing why it was.
			var pods corev1.PodList
			Expect(k.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/component": "backup"})).To(Succeed())
			retried := map[string]bool{}
			for _, p := range pods.Items {
				if job := p.Labels[batchv1.JobNameLabel]; p.Status.Phase == corev1.PodFailed && !retried[job] {
					retried[job] = true
					GinkgoWriter.Printf("backup Job %s retried a pod:%s\n", job, jobAttempts(ns, job, "", "", ""))
				}
			}
			GinkgoWriter.Printf("most backups at once: ssd %v running, %v waiting; hdd %v running, %v waiting\n",
				load["ssd"].inflight, load["ssd"].queued, load["hdd"].inflight, load["hdd"].queued)

			By("every series holds exactly the one scheduled version, of the whole tree")
			for _, name := range names {
				bs := getSeries(ns, name)
				Expect(bs.Status.VersionCount).To(Equal(int32(1)), "series %s", name)
				Expect(version(bs, 1)).NotTo(BeNil(), "series %s: versions %v", name, versionNumbers(bs))
				Expect(version(bs, 1).LogicalBytes).To(Equal(sum0.Bytes), "series %s", name)
				Expect(bs.Status.LastJob).NotTo(BeNil(), "series %s: no Job recorded", name)
				Expect(bs.Status.LastJob.Succeeded).To(BeTrue(), "series %s", name)
			}
			for media, l := range load {
				Expect(l.inflight).To(BeNumerically("<=", slotsPerWorker), "the %s worker ran more backups at once than its slots", media)
			}
			Expect(load["ssd"].queued+load["hdd"].queued).To(BeNumerically(">", 0),
				"no backup ever waited for a slot: the scenario did not load the workers")

			By("restoring one series of each worker byte-exact")
			expectRestore(ns, "restore-ssd", names[0], "latest", 1, sum0, "series "+names[0]+" (ssd)")
			expectRestore(ns, "restore-hdd", names[1], "latest", 1, sum0, "series "+names[1]+" (hdd)")
		})
	})
}
