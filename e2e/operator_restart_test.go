package e2e

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// leaderLease is the operator's leader election Lease (in the operator's namespace).
const leaderLease = "revault-operator.backup.revault.io"

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

// backupThroughOperatorLoss starts a backup that streams for a while, runs lose (which takes
// operator pods away) while the worker receives it, and checks that the operator that leads
// afterwards records the version once, from the Job that ran through the loss, and that it
// restores byte-exact.
func backupThroughOperatorLoss(prefix string, seed int, lose func()) {
	GinkgoHelper()
	const series, src = "steady", "src"
	ns := newNamespace(prefix)
	createPVC(ns, src)
	gen := genTree(ns, src, seed, 8, 256<<20)
	sum0 := sumTree(ns, src)
	Expect(sum0.Bytes).To(Equal(gen.Bytes))
	Expect(k.Create(ctx, newSeries(ns, series, src, backupv1alpha1.MediaSSD))).To(Succeed())
	bs := waitSeriesReady(ns, series)
	node := bs.Status.Worker.Node
	m, err := workerMetrics("ssd", node)
	Expect(err).NotTo(HaveOccurred())
	received0 := m["revault_received_bytes_total"]

	// A CPU cap on the Job makes the stream last beyond the operator's loss (~10-20 s).
	lr := slowJobs(ns)
	requestBackup(ns, series, "during-loss")

	By("waiting until the worker receives the backup stream")
	waitStreaming("ssd", node, received0)
	running := backupJobs(ns, series)
	Expect(running).To(HaveLen(1))
	Expect(running[0].Status.Succeeded).To(BeZero(), "the backup ended before the operator was lost")
	lose()
	Expect(k.Delete(ctx, lr)).To(Succeed())

	By("the operator records exactly one version, from the Job that ran through the loss")
	bs = waitVersion(ns, series, 1)
	Expect(bs.Status.VersionCount).To(Equal(int32(1)), "the request was backed up twice")
	Expect(version(bs, 1).LogicalBytes).To(Equal(sum0.Bytes))
	// The Job started before the loss is the one that succeeded (not one made again).
	jobs := backupJobs(ns, series)
	Expect(jobs).To(HaveLen(1))
	Expect(jobs[0].UID).To(Equal(running[0].UID))
	Expect(jobs[0].Status.Succeeded).To(Equal(int32(1)))

	By("restoring the version byte-exact")
	expectRestore(ns, "restore", series, "latest", 1, sum0, "version 1 across the operator's loss")
}

// leaseHolder is the operator pod holding the leader election lease ("" when none does).
func leaseHolder(g Gomega) string {
	l := &coordinationv1.Lease{}
	g.Expect(k.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: leaderLease}, l)).To(Succeed())
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod
}

// scaleOperator sets the operator Deployment's replicas and waits until that many pods are ready.
func scaleOperator(n int32) {
	GinkgoHelper()
	d := &appsv1.Deployment{}
	Expect(k.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: operatorDep}, d)).To(Succeed())
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Replicas = &n
	Expect(k.Patch(ctx, d, patch)).To(Succeed())
	Eventually(func(g Gomega) {
		pods := operatorPods(g)
		g.Expect(pods).To(HaveLen(int(n)))
		for _, p := range pods {
			g.Expect(podReady(&p)).To(BeTrue(), "operator pod %s not ready", p.Name)
		}
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
}

// 7b. The operator's pod is killed while a backup Job it started streams to the worker. The
// Job goes on without it; the new operator pod takes the lease, records the version (one: the
// request is not backed up twice), and the version restores byte-exact.
//
// 7c. The same with two operator replicas: the leader is killed, and another live pod (the
// standby, or the leader's replacement if it starts first) takes the lease and carries on.
func operatorRestartSpecs() {
	Describe("7b. the operator restarted mid-backup", Ordered, func() {
		It("finishes the backup once, and the new operator records it", func() {
			backupThroughOperatorLoss("e2e-oprestart", 71, func() {
				By("killing the operator's pods (grace period 0) while the Job runs")
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
			})
		})
	})

	Describe("7c. leader failover with two operator replicas", Ordered, func() {
		BeforeAll(func() {
			By("scaling the operator to two replicas")
			scaleOperator(2)
			DeferCleanup(func() { scaleOperator(1) })
		})

		It("another pod takes the lease when the leader is killed mid-backup, and records the backup once", func() {
			backupThroughOperatorLoss("e2e-opfailover", 73, func() {
				var leader, standby string
				Eventually(func(g Gomega) {
					leader = leaseHolder(g)
					pods := operatorPods(g)
					g.Expect(pods).To(HaveLen(2))
					for _, p := range pods {
						if p.Name != leader {
							standby = p.Name
						}
					}
					g.Expect([]string{pods[0].Name, pods[1].Name}).To(ContainElement(leader))
				}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
				By("killing the leader " + leader + " (grace period 0); " + standby + " stands by")
				start := time.Now()
				Expect(k.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: leader}},
					client.GracePeriodSeconds(0))).To(Succeed())
				// The standby usually wins; the leader's replacement pod may win the election
				// instead when it starts before the lease expires. Either is a failover: what
				// matters is that a live pod leads and records the backup once.
				var holder string
				Eventually(func(g Gomega) {
					holder = leaseHolder(g)
					g.Expect(holder).NotTo(BeEmpty())
					g.Expect(holder).NotTo(Equal(leader))
					var names []string
					for _, p := range operatorPods(g) {
						names = append(names, p.Name)
					}
					g.Expect(names).To(ContainElement(holder))
				}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
				GinkgoWriter.Printf("the lease moved from %s to %s in %s (the standby was %s)\n",
					leader, holder, time.Since(start).Round(time.Second), standby)
			})
		})
	})
}
