package controller

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
)

var _ = Describe("Worker pools", func() {
	It("runs a DaemonSet per media on the labelled nodes, with the store on the host path", func() {
		for _, media := range []string{"ssd", "hdd"} {
			ds := &appsv1.DaemonSet{}
			Eventually(func() error {
				return k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: "revault-worker-" + media}, ds)
			}).Should(Succeed())
			pod := ds.Spec.Template.Spec
			Expect(pod.NodeSelector).To(HaveKeyWithValue(backupv1alpha1.StorageLabel, media))
			c := pod.Containers[0]
			Expect(c.Image).To(Equal("revault.local/revault:test"))
			Expect(strings.Join(c.Args, " ")).To(HavePrefix(
				"serve --store /var/lib/revault --init --listen 0.0.0.0:8420 --token-file /etc/revault/tokens/tokens"))
			Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz?exclude=writes"))
			Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.HostPath.Path", "/var/lib/revault/"+media)))
			Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", plan.WorkerTokensSecret)))
			Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
			Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		}
	})

	It("puts the deleted DaemonSet of a configured pool back", func() {
		ds := &appsv1.DaemonSet{}
		key := types.NamespacedName{Namespace: operatorNS, Name: "revault-worker-hdd"}
		Eventually(func() error { return k8sClient.Get(ctx, key, ds) }).Should(Succeed())
		uid := ds.UID
		Expect(k8sClient.Delete(ctx, ds)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, ds)).To(Succeed())
			g.Expect(ds.UID).NotTo(Equal(uid))
		}).Should(Succeed())
	})

	It("labels each worker pod with its node and gives each node's worker a Service", func() {
		requireWorkers()
		for _, w := range workerNodes {
			pod := &corev1.Pod{}
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: workerPodName(w.node, w.media)}, pod)).To(Succeed())
				g.Expect(pod.Labels).To(HaveKeyWithValue(plan.LabelNode, w.node))
			}).Should(Succeed())
			svc := &corev1.Service{}
			Eventually(func() error {
				return k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS,
					Name: "revault-worker-" + string(w.media) + "-" + w.node}, svc)
			}).Should(Succeed())
			Expect(svc.Spec.Selector).To(Equal(map[string]string{
				plan.LabelName: "revault", plan.LabelComponent: "worker",
				plan.LabelPool: string(w.media), plan.LabelNode: w.node,
			}))
			Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(8420))
			// The Service selects exactly this node's worker pod.
			var pods corev1.PodList
			Expect(k8sClient.List(ctx, &pods, client.InNamespace(operatorNS), client.MatchingLabels(svc.Spec.Selector))).To(Succeed())
			Expect(pods.Items).To(HaveLen(1))
			Expect(pods.Items[0].Spec.NodeName).To(Equal(w.node))
		}
	})

	It("keeps a Service for a labelled node until the label goes", func() {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-hdd-9",
			Labels: map[string]string{backupv1alpha1.StorageLabel: "hdd"}}}
		Expect(k8sClient.Create(ctx, node)).To(Succeed())
		key := types.NamespacedName{Namespace: operatorNS, Name: "revault-worker-hdd-node-hdd-9"}
		Eventually(func() error { return k8sClient.Get(ctx, key, &corev1.Service{}) }).Should(Succeed())

		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
				return err
			}
			delete(node.Labels, backupv1alpha1.StorageLabel)
			return k8sClient.Update(ctx, node)
		}).Should(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, key, &corev1.Service{}))
		}).WithTimeout(20 * time.Second).Should(BeTrue())
	})

	It("keeps the worker token file with the operator's admin token", func() {
		requireWorkers()
		Expect(adminToken()).To(HaveLen(64))
		// The admin token sees store totals on every worker.
		for _, w := range workerNodes {
			_, err := adminClient(w.node).Stats(ctx)
			Expect(err).NotTo(HaveOccurred())
		}
	})

	It("revokes the token of a namespace that is gone", func() {
		requireWorkers()
		ns := newNamespace("gone")
		placedSeries(pvcSeries(ns, "db"))
		_, ok := tokens.Lookup(workerTokens(), ns)
		Expect(ok).To(BeTrue())
		// Envtest has no namespace controller, so a deleted namespace stays Terminating; the
		// operator prunes only namespaces that no longer exist. Use a namespace-less scope to
		// stand in: add a token for a namespace that never existed and watch it go.
		Eventually(func() error {
			sec := &corev1.Secret{}
			if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerTokensSecret}, sec); err != nil {
				return err
			}
			sec.Data[plan.WorkerTokensKey] = append(sec.Data[plan.WorkerTokensKey], []byte("stale-token never-existed\n")...)
			return k8sClient.Update(ctx, sec)
		}).Should(Succeed())
		Eventually(func() bool {
			_, ok := tokens.Lookup(workerTokens(), "never-existed")
			return ok
		}).WithTimeout(20 * time.Second).Should(BeFalse())
		_, ok = tokens.Lookup(workerTokens(), ns)
		Expect(ok).To(BeTrue(), "the token of a live namespace must stay")
	})
})
