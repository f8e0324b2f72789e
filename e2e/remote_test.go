package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// waitDurable waits until the series' newest version is version want and the bucket holds it
// (status.durableVersion, condition Durable=True).
func waitDurable(ns, name string, want int64) *backupv1alpha1.BackupSeries {
	GinkgoHelper()
	var bs *backupv1alpha1.BackupSeries
	Eventually(func(g Gomega) {
		bs = getSeries(ns, name)
		g.Expect(bs.Status.LatestVersion).To(Equal(want))
		g.Expect(bs.Status.DurableVersion).To(Equal(want), "conditions %v", bs.Status.Conditions)
		c := condition(bs.Status.Conditions, backupv1alpha1.ConditionDurable)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Durable: %s", c.Message)
	}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
	return bs
}

// mutate changes the tree in claim (rewrites `rewrite` files, adds `add` bytes).
func mutate(ns, claim string, seed, rewrite int, add int64) {
	GinkgoHelper()
	var m toolresult.Mutate
	args := []string{"mutate", "-dir", "/data", "-seed", runSeed(seed), "-rewrite", fmt.Sprint(rewrite)}
	if add > 0 {
		args = append(args, "-add", fmt.Sprint(add))
	}
	tool(toolPod(ns, podName("mutate"), claim, args...), &m)
}

func docker(args ...string) string {
	GinkgoHelper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "docker %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// 11. The bucket away for a while: backups still succeed (on the worker's disk), the series says
// the remote is behind, and once the bucket is back the remote catches up.
func remoteOutageSpecs() {
	Describe("11. the remote's bucket unreachable for a while", Ordered, func() {
		It("takes backups meanwhile, reports Durable=False, and catches up when the bucket is back", func() {
			ns := newNamespace("e2e-11")
			createPVC(ns, "src")
			genTree(ns, "src", 110, 6, 6<<20)
			Expect(k.Create(ctx, newSeries(ns, "app", "src", backupv1alpha1.MediaSSD))).To(Succeed())
			bs := waitSeriesReady(ns, "app")
			backupNow(ns, "app", "one", 1)
			waitDurable(ns, "app", 1)

			By("scaling the S3 server to zero: the bucket is away")
			scaleS3(0)
			DeferCleanup(func() { scaleS3(1) })
			mutate(ns, "src", 111, 2, 0)
			sum2 := sumTree(ns, "src")
			backupNow(ns, "app", "two", 2)
			By("the series says the bucket holds version 1 only, and after remote.behindAfter that it is behind")
			Eventually(func(g Gomega) {
				st := getSeries(ns, "app").Status
				g.Expect(st.DurableVersion).To(Equal(int64(1)))
				c := condition(st.Conditions, backupv1alpha1.ConditionDurable)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Reason).To(Equal("RemoteBehind"))
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
			m, err := workerMetrics("ssd", bs.Status.Worker.Node)
			Expect(err).NotTo(HaveOccurred())
			Expect(m["revault_remote_lag_seconds"]).To(BeNumerically(">", 0))

			By("the bucket comes back: the worker uploads what it holds, and nothing is lost")
			scaleS3(1)
			waitDurable(ns, "app", 2)
			expectRestore(ns, "restore-two", "app", "2", 2, sum2, "version 2, backed up while the bucket was away")
		})
	})
}

// 12. A storage node lost for good: the store of the spare node (labelled ssd for this scenario)
// is rebuilt from the bucket on the other ssd node, the series on it go on, and every version
// restores byte-exact.
func lostNodeSpecs() {
	Describe("12. losing a node for good", Ordered, func() {
		var spare, ssdNode string

		BeforeAll(func() {
			spare, ssdNode = spareAsSSD()
			workerPod("ssd", spare)
		})

		It("rebuilds the node's store on another ssd node from the bucket; backups continue, every version restores byte-exact", func() {
			ns := newNamespace("e2e-12")
			createPVC(ns, "src")
			genTree(ns, "src", 120, 6, 8<<20)
			sum1 := sumTree(ns, "src")
			Expect(k.Create(ctx, newSeries(ns, "db", "src", backupv1alpha1.MediaSSD))).To(Succeed())
			placeOn(ns, "db", spare, backupv1alpha1.MediaSSD)
			waitSeriesReady(ns, "db")
			backupNow(ns, "db", "one", 1)
			mutate(ns, "src", 121, 2, 2<<20)
			sum2 := sumTree(ns, "src")
			backupNow(ns, "db", "two", 2)
			waitDurable(ns, "db", 2)

			By("stopping node " + spare + " for good (its disk with it)")
			docker("stop", spare)
			adopted := "revault-store-ssd-" + spare
			By("the operator rebuilds its store on " + ssdNode + " (Deployment " + adopted + ")")
			Eventually(func(g Gomega) {
				st := getSeries(ns, "db").Status
				g.Expect(st.Worker.Node).To(Equal(spare))
				g.Expect(st.Worker.Host).To(Equal(ssdNode))
				c := condition(st.Conditions, backupv1alpha1.ConditionPlaced)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Placed: %s", c.Message)
				g.Expect(c.Reason).To(Equal("StoreAdopted"))
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
			Expect(eventReasons(events(ns, "db"))).To(ContainElement("StoreAdopted"))

			By("backups continue on the rebuilt store")
			mutate(ns, "src", 122, 1, 0)
			sum3 := sumTree(ns, "src")
			backupNow(ns, "db", "three", 3)
			waitDurable(ns, "db", 3)

			By("every version restores byte-exact")
			expectRestore(ns, "restore-one", "db", "1", 1, sum1, "version 1, from the rebuilt store")
			expectRestore(ns, "restore-two", "db", "2", 2, sum2, "version 2, from the rebuilt store")
			expectRestore(ns, "restore-three", "db", "3", 3, sum3, "version 3, backed up after the rebuild")
		})
	})
}

// spareAsSSD labels the spare node ssd (restored, unlabelled and without stores, when the
// calling container ends) and returns it with the cluster's own ssd node.
func spareAsSSD() (spare, ssdNode string) {
	GinkgoHelper()
	spare = mustEnv("E2E_SPARE_NODE")
	ssdNode = storageNode("ssd")
	By("labelling the spare node " + spare + " revault.io/storage=ssd")
	labelNode(spare, "ssd")
	DeferCleanup(func() { restoreSpare(spare) })
	return spare, ssdNode
}

func labelNode(node, media string) {
	GinkgoHelper()
	patchNode(node, func(n *corev1.Node) {
		if media == "" {
			delete(n.Labels, storageLabel)
		} else {
			n.Labels[storageLabel] = media
		}
	})
}

// patchNode applies change to a Node as a merge patch.
func patchNode(node string, change func(*corev1.Node)) {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(k.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	patch := client.MergeFrom(n.DeepCopy())
	change(n)
	Expect(k.Patch(ctx, n, patch)).To(Succeed())
}

// placeOn puts a new series on the store of node's media worker: placement picks the worker
// with the most room, which may be another; the scenario needs the spare's. The placement record
// is moved too, as the operator keeps it equal to the status.
func placeOn(ns, name, node string, media backupv1alpha1.Media) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		bs := getSeries(ns, name)
		g.Expect(bs.Status.Worker).NotTo(BeNil())
		if bs.Status.Worker.Node == node {
			return
		}
		patch := client.MergeFrom(bs.DeepCopy())
		bs.Annotations[backupv1alpha1.PlacementAnnotation] = string(media) + "/" + node
		g.Expect(k.Patch(ctx, bs, patch)).To(Succeed())
		bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: media, Node: node,
			Endpoint: workerEndpoint(string(media), node)}
		g.Expect(k.Status().Update(ctx, bs)).To(Succeed())
		g.Expect(getSeries(ns, name).Status.Worker.Node).To(Equal(node))
	}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
}

// restoreSpare brings the spare node back to what kind-up.sh left: running, Ready, unlabelled,
// without stores, and no adopted store serving its old one.
func restoreSpare(spare string) {
	_ = exec.Command("docker", "start", spare).Run()
	for _, media := range []string{"ssd", "hdd"} {
		dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "revault-store-" + media + "-" + spare}}
		if err := k.Delete(ctx, dep); err != nil && !apierrors.IsNotFound(err) {
			Expect(err).NotTo(HaveOccurred())
		}
	}
	labelNode(spare, "")
	Eventually(func(g Gomega) {
		n := &corev1.Node{}
		g.Expect(k.Get(ctx, client.ObjectKey{Name: spare}, n)).To(Succeed())
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		g.Expect(ready).To(BeTrue())
		var pods corev1.PodList
		g.Expect(k.List(ctx, &pods, client.InNamespace(systemNS),
			client.MatchingLabels{"app.kubernetes.io/component": "worker"})).To(Succeed())
		for _, p := range pods.Items {
			// A worker pod the spare's kubelet rejected on its return (its node no longer
			// matches) stays Failed: nothing serves from it, and its store is wiped below.
			if p.Spec.NodeName == spare && p.Status.Phase == corev1.PodFailed {
				_ = k.Delete(ctx, &p, client.GracePeriodSeconds(0))
				continue
			}
			g.Expect(p.Spec.NodeName == spare || strings.HasPrefix(p.Name, "revault-store-")).To(BeFalse(),
				"pod %s (%s) still there", p.Name, p.Status.Phase)
		}
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
	docker("exec", spare, "rm", "-rf", "/var/lib/revault")
}
