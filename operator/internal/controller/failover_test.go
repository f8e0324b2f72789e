package controller

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// pull restores version v of ns/name from node's store into a new directory, as a restore Job's
// pod does.
func pull(ns, name, node string, v int) string {
	dir, err := os.MkdirTemp(scratch, "pulled-")
	Expect(err).NotTo(HaveOccurred())
	out, errOut, ok := runRevault("--json", "--quiet", "pull", "--server", workerURL[node],
		"--token-file", nsTokenFile(ns), "--series", plan.SeriesID(ns, name),
		"--version", strconv.Itoa(v), "-o", dir+"/")
	Expect(ok).To(BeTrue(), "revault pull: %s%s", out, errOut)
	return dir
}

var _ = Describe("Losing a node (with a remote)", Ordered, func() {
	BeforeAll(requireWorkers)

	It("rebuilds the node's store on another node from the bucket; its series go on with their whole history", func() {
		// The SSD node the store is rebuilt on: a Ready Node (the operator adopts a lost store only
		// where another node of its pool can take it).
		host := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: "node-ssd-1", Labels: map[string]string{backupv1alpha1.StorageLabel: "ssd"},
		}}
		Expect(k8sClient.Create(ctx, host)).To(Succeed())
		host.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		Expect(k8sClient.Status().Update(ctx, host)).To(Succeed())
		// A fourth SSD node with its worker, as the DaemonSet controller and the kubelet make them.
		Expect(k8sClient.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: lostNode, Labels: map[string]string{backupv1alpha1.StorageLabel: "ssd"},
		}})).To(Succeed())
		proc := startWorker(lostNode, workerTokenFile)
		makeWorkerPod(lostNode, backupv1alpha1.MediaSSD)
		podKey := types.NamespacedName{Namespace: operatorNS, Name: workerPodName(lostNode, backupv1alpha1.MediaSSD)}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS,
				Name: plan.WorkerServiceName("ssd", lostNode)}, &corev1.Service{})).To(Succeed())
		}).Should(Succeed())

		// A series whose store is that node's: two versions, both in the bucket.
		ns := newNamespace("lost")
		placedSeries(pvcSeries(ns, "db"))
		Eventually(func() error {
			cur := getSeries(ns, "db")
			cur.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: "ssd", Node: lostNode,
				Endpoint: plan.WorkerEndpoint(plan.WorkerServiceName("ssd", lostNode), operatorNS, 8420, false)}
			return k8sClient.Status().Update(ctx, cur)
		}).Should(Succeed())
		v1, v2 := randomTree(256), randomTree(256)
		push(ns, "db", lostNode, v1)
		push(ns, "db", lostNode, v2)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.LatestVersion).To(BeEquivalentTo(2))
			g.Expect(st.DurableVersion).To(BeEquivalentTo(2))
			c := condition(st.Conditions, backupv1alpha1.ConditionDurable)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		// The node is lost for good: its worker dies with it, the Node is deleted, and the pod
		// garbage collector removes its pod.
		Expect(proc.Process.Kill()).To(Succeed())
		_ = proc.Wait()
		Expect(k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: lostNode}})).To(Succeed())
		Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podKey.Namespace, Name: podKey.Name}},
			client.GracePeriodSeconds(0))).To(Succeed())

		// The operator rebuilds the store elsewhere, and says so on the series.
		dep := &appsv1.Deployment{}
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.AdoptedStoreName("ssd", lostNode)}, dep)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(dep.Spec.Template.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{
			Name: "REVAULT_REMOTE", Value: "s3://revault-envtest/ssd/" + lostNode}))
		// Pinned to the Ready SSD node chosen to keep it: a replaced pod finds the store there.
		hostNode := dep.Annotations[plan.AnnotationHost]
		Expect(hostNode).NotTo(BeEmpty())
		Expect(hostNode).NotTo(Equal(lostNode))
		term := dep.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]
		Expect(term.MatchFields).To(ConsistOf(corev1.NodeSelectorRequirement{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{hostNode}}))
		Eventually(func() []string { return eventNotes(getSeries(ns, "db")) }).Should(ContainElement(ContainSubstring(
			"node " + lostNode + " is gone")))

		// Play the Deployment controller, the scheduler and the kubelet: its pod on that node runs `revault serve --init --recover` over an empty directory.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: dep.Name + "-x1", Namespace: operatorNS,
				Labels: dep.Spec.Template.Labels, Annotations: dep.Spec.Template.Annotations},
			Spec: corev1.PodSpec{NodeName: hostNode, TerminationGracePeriodSeconds: ptr.To(int64(0)),
				Containers: []corev1.Container{{Name: "revault", Image: opConfig.Worker.Image}}},
		}
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		adopted := startWorkerAt(lostNode, hostNode, backupv1alpha1.MediaSSD, filepath.Join(scratch, "adopted-"+lostNode), workerTokenFile)
		workerProcs = append(workerProcs, adopted)
		setPodReady(pod, true)

		// The series keeps its store (its node), now served from the host.
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.Worker.Node).To(Equal(lostNode))
			g.Expect(st.Worker.Host).To(Equal(hostNode))
			g.Expect(st.Worker.Pod).To(Equal(pod.Name))
			c := condition(st.Conditions, backupv1alpha1.ConditionPlaced)
			g.Expect(c.Reason).To(Equal("StoreAdopted"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		// The lost node's Service reaches the adopted pod.
		svc := &corev1.Service{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerServiceName("ssd", lostNode)}, svc)).To(Succeed())
		for k, v := range svc.Spec.Selector {
			Expect(pod.Labels).To(HaveKeyWithValue(k, v))
		}

		// Every version restores byte-exact from the rebuilt store, and backups go on.
		sameTree(v1, pull(ns, "db", lostNode, 1))
		sameTree(v2, pull(ns, "db", lostNode, 2))
		v3 := randomTree(128)
		push(ns, "db", lostNode, v3)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.LatestVersion).To(BeEquivalentTo(3))
			g.Expect(st.DurableVersion).To(BeEquivalentTo(3))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		sameTree(v3, pull(ns, "db", lostNode, 3))

		// A new series goes to a node's own worker, never to the store of the node that is gone,
		// even when that store is the least used of the pool.
		for _, n := range []string{"node-ssd-1", "node-ssd-2"} {
			push(ns, "filler-"+n, n, randomTree(1024))
		}
		for _, name := range []string{"new1", "new2", "new3"} {
			bs := placedSeries(pvcSeries(ns, name))
			Expect(bs.Status.Worker.Node).NotTo(Equal(lostNode))
			Expect(bs.Status.Worker.Host).To(Equal(bs.Status.Worker.Node))
		}
	})
})
