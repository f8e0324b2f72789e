package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// operatorPods are the operator's pods that are not being deleted.
func operatorPods(g Gomega) []corev1.Pod {
	var pods corev1.PodList
	g.Expect(k.List(ctx, &pods, client.InNamespace(systemNS),
		client.MatchingLabels{"app.kubernetes.io/component": "operator"})).To(Succeed())
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// 7b. The operator's pod is killed while a backup Job it started streams to the worker. The
// Job goes on without it; the new operator pod takes the lease, records the version (one: the
// request is not backed up twice), and the version restores byte-exact.
func operatorRestartSpecs() {
	Describe("7b. the operator restarted mid-backup", Ordered, func() {
		const series, src = "steady", "src"
		It("finishes the backup once, and the new operator records it", func() {
			ns := newNamespace("e2e-oprestart")
			createPVC(ns, src)
			gen := genTree(ns, src, 71, 8, 256<<20)
			sum0 := sumTree(ns, src)
			Expect(sum0.Bytes).To(Equal(gen.Bytes))
			Expect(k.Create(ctx, newSeries(ns, series, src, backupv1alpha1.MediaSSD))).To(Succeed())
			bs := waitSeriesReady(ns, series)
			node := bs.Status.Worker.Node
			m, err := workerMetrics("ssd", node)
			Expect(err).NotTo(HaveOccurred())
			received0 := m["revault_received_bytes_total"]

			// A CPU cap on the Job makes the stream last beyond the operator's restart (~10 s).
			lr := slowJobs(ns)
			requestBackup(ns, series, "during-restart")

			By("waiting until the worker receives the backup stream")
			waitStreaming("ssd", node, received0)

			By("killing the operator's pods (grace period 0) while the Job runs")
			running := backupJobs(ns, series)
			Expect(running).To(HaveLen(1))
			Expect(running[0].Status.Succeeded).To(BeZero(), "the backup ended before the operator was killed")
			old := operatorPods(Default)
			Expect(old).NotTo(BeEmpty())
			for i := range old {
				Expect(k.Delete(ctx, &old[i], client.GracePeriodSeconds(0))).To(Succeed())
			}
			Eventually(func(g Gomega) {
				pods := operatorPods(g)
				g.Expect(pods).NotTo(BeEmpty())
				for _, p := range pods {
					g.Expect(p.UID).NotTo(BeElementOf(old[0].UID))
					g.Expect(podReady(&p)).To(BeTrue(), "operator pod %s not ready", p.Name)
				}
			}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
			Expect(k.Delete(ctx, lr)).To(Succeed())

			By("the new operator records exactly one version, from the Job that ran through the restart")
			bs = waitVersion(ns, series, 1)
			Expect(bs.Status.VersionCount).To(Equal(int32(1)), "the request was backed up twice")
			Expect(version(bs, 1).LogicalBytes).To(Equal(sum0.Bytes))
			// The Job started before the restart is the one that succeeded (not one made again).
			jobs := backupJobs(ns, series)
			Expect(jobs).To(HaveLen(1))
			Expect(jobs[0].UID).To(Equal(running[0].UID))
			Expect(jobs[0].Status.Succeeded).To(Equal(int32(1)))

			By("restoring the version byte-exact")
			expectRestore(ns, "restore", series, "latest", 1, sum0, "version 1 across the operator's restart")
		})
	})
}
