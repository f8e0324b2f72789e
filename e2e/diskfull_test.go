package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// storeDisk is the size of the small filesystem (a tmpfs) the spare node's worker gets in
// scenario 14: room for the scenario's two versions, and little enough to fill in a moment.
const storeDisk = "384m"

// failedPodMessages are the termination messages of the failed pods of a Job.
func failedPodMessages(ns, job string) []string {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"job-name": job})).To(Succeed())
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodFailed {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if t := c.State.Terminated; t != nil {
				out = append(out, t.Message)
			}
		}
	}
	return out
}

// deleteSeriesOn deletes every BackupSeries placed on node's store of media and waits until
// they are gone (their finalizers ran against that worker).
func deleteSeriesOn(node string, media backupv1alpha1.Media) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var all backupv1alpha1.BackupSeriesList
		g.Expect(k.List(ctx, &all)).To(Succeed())
		var left []string
		for i := range all.Items {
			bs := &all.Items[i]
			if w := bs.Status.Worker; w != nil && w.Node == node && w.Media == media {
				left = append(left, bs.Namespace+"/"+bs.Name)
				if bs.DeletionTimestamp == nil {
					g.Expect(client.IgnoreNotFound(k.Delete(ctx, bs))).To(Succeed())
				}
			}
		}
		g.Expect(left).To(BeEmpty(), "%s series still on node %s", media, node)
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
}

// 14. A worker's disk filled in the middle of a backup, then freed. The backup fails with an
// error that says the disk is full, nothing committed is lost (the earlier version still
// restores), and once space is back the same worker pod, without a restart, takes the backup
// again: the Job's retry commits it and it restores byte-exact.
func diskFullSpecs() {
	Describe("14. a worker's disk filled, then freed", Ordered, func() {
		var spare string

		BeforeAll(func() {
			spare = mustEnv("E2E_SPARE_NODE")
			By("giving the spare node " + spare + " a " + storeDisk + " store filesystem and labelling it hdd")
			docker("exec", spare, "sh", "-c", "mkdir -p /var/lib/revault && mount -t tmpfs -o size="+storeDisk+" revault-small /var/lib/revault")
			// Cleanups run last-registered first, each even if another failed, so that a
			// failure anywhere leaves the spare as kind-up.sh made it for scenario 12.
			DeferCleanup(func() { restoreSpare(spare) })
			DeferCleanup(func() {
				if exec.Command("docker", "exec", spare, "umount", "/var/lib/revault").Run() != nil {
					_ = exec.Command("docker", "exec", spare, "umount", "-l", "/var/lib/revault").Run()
				}
			})
			DeferCleanup(func() {
				labelNode(spare, "")
				Eventually(func(g Gomega) {
					var pods corev1.PodList
					g.Expect(k.List(ctx, &pods, client.InNamespace(systemNS),
						client.MatchingLabels{"app.kubernetes.io/component": "worker"})).To(Succeed())
					for _, p := range pods.Items {
						g.Expect(p.Spec.NodeName).NotTo(Equal(spare), "worker pod %s still on the spare", p.Name)
					}
				}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
			})
			// Series placed on the spare's store go before its label: a labelled node that
			// loses its label with series on its store counts as lost, and its store would be
			// adopted. The disk is freed first (a spec that failed while it was full), so
			// their deletion can reach the worker.
			DeferCleanup(func() { deleteSeriesOn(spare, backupv1alpha1.MediaHDD) })
			DeferCleanup(func() { _ = exec.Command("docker", "exec", spare, "rm", "-f", "/var/lib/revault/filler").Run() })
			labelNode(spare, "hdd")
			workerPod("hdd", spare)
		})

		It("fails the backup with a full-disk error, keeps what was committed, and takes the backup again once freed", func() {
			ns := newNamespace("e2e-14")
			createPVC(ns, "src")
			genTree(ns, "src", 140, 4, 32<<20)
			sum1 := sumTree(ns, "src")
			bs := newSeries(ns, "db", "src", backupv1alpha1.MediaHDD)
			bs.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			Expect(k.Create(ctx, bs)).To(Succeed())
			placeOn(ns, "db", spare, backupv1alpha1.MediaHDD)
			waitSeriesReady(ns, "db")
			backupNow(ns, "db", "one", 1)
			worker := workerPod("hdd", spare)

			By("adding 160 MiB of new data and starting the backup of it, slowed down")
			mutate(ns, "src", 141, 1, 160<<20)
			sum2 := sumTree(ns, "src")
			m, err := workerMetrics("hdd", spare)
			Expect(err).NotTo(HaveOccurred())
			lr := slowJobs(ns)
			requestBackup(ns, "db", "two")
			waitStreaming("hdd", spare, m["revault_received_bytes_total"])

			By("filling the worker's disk while the backup streams")
			// dd stops when nothing is left, which is the point: its "No space left on device"
			// is the proof the filesystem was full. What df says a moment later is only
			// logged: the worker may already have dropped the failed upload's partial
			// container (a CI run saw 12 MB back within half a second), which is right.
			out := docker("exec", spare, "sh", "-c", "dd if=/dev/zero of=/var/lib/revault/filler bs=1M 2>&1; df -B1 --output=avail /var/lib/revault | tail -1")
			Expect(out).To(ContainSubstring("No space left on device"), "dd did not fill the store filesystem: %s", out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			GinkgoWriter.Printf("the store filesystem filled; bytes free just after: %s\n", lines[len(lines)-1])
			var running []string
			for _, j := range backupJobs(ns, "db") {
				if j.Status.Succeeded == 0 {
					running = append(running, j.Name)
				}
			}
			Expect(running).To(HaveLen(1), "the backup Job of request two")
			var msgs []string
			Eventually(func(g Gomega) {
				msgs = failedPodMessages(ns, running[0])
				g.Expect(msgs).NotTo(BeEmpty(), "no attempt of Job %s failed yet", running[0])
			}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
			GinkgoWriter.Printf("the failed attempt said: %s\n", msgs[0])
			// The worker's own words (507 no_space, or 503 once the store is degraded), not a
			// broken pipe: it reads what the client still sends while its answer goes out.
			Expect(msgs[0]).To(MatchRegexp(`disk is full|until space is freed|full disk`),
				"the failed backup does not say the disk is full")
			Expect(msgs[0]).NotTo(ContainSubstring("Broken pipe"))
			st := getSeries(ns, "db").Status
			Expect(st.LatestVersion).To(Equal(int64(1)), "a version was committed on a full disk")

			By("freeing the disk: the Job's retry commits version 2 on the same worker pod")
			docker("exec", spare, "rm", "/var/lib/revault/filler")
			Expect(k.Delete(ctx, lr)).To(Succeed())
			bs2 := waitVersion(ns, "db", 2)
			Expect(bs2.Status.VersionCount).To(Equal(int32(2)))
			Expect(version(bs2, 2)).NotTo(BeNil())
			Expect(version(bs2, 2).LogicalBytes).To(Equal(sum2.Bytes))
			after := workerPod("hdd", spare)
			Expect(after.UID).To(Equal(worker.UID), "the worker pod was replaced")
			restarts := int32(0)
			for _, c := range after.Status.ContainerStatuses {
				restarts += c.RestartCount
			}
			Expect(restarts).To(BeZero(), "the worker restarted")
			if m, err := workerMetrics("hdd", spare); err == nil {
				GinkgoWriter.Printf("worker: revault_store_reopens_total %v, revault_store_degraded %v\n",
					m["revault_store_reopens_total"], m["revault_store_degraded"])
			}

			By("both versions restore byte-exact")
			expectRestore(ns, "restore-one", "db", "1", 1, sum1, "version 1, committed before the disk filled")
			expectRestore(ns, "restore-two", "db", "2", 2, sum2, fmt.Sprintf("version 2, backed up after the disk was freed (%d bytes)", sum2.Bytes))
		})
	})
}
