package e2e

import (
	"crypto/x509"
	"encoding/pem"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// workerTLSSecret is where the operator keeps the workers' certificate.
const workerTLSSecret = "revault-worker-tls"

// workerCertSerial is the serial number of the certificate in the workers' Secret ("" while the
// Secret is missing).
func workerCertSerial(g Gomega) string {
	s := &corev1.Secret{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: workerTLSSecret}, s); err != nil {
		return ""
	}
	b, _ := pem.Decode(s.Data["tls.crt"])
	g.Expect(b).NotTo(BeNil(), "secret %s has no PEM tls.crt", workerTLSSecret)
	c, err := x509.ParseCertificate(b.Bytes)
	g.Expect(err).NotTo(HaveOccurred())
	return c.SerialNumber.String()
}

// committedStream waits for an `e2e-tool slowpush` pod and expects its backup committed whole
// and read back the same.
func committedStream(push *corev1.Pod, size int64) toolresult.SlowPush {
	GinkgoHelper()
	logs, phase := waitPod(push)
	var res toolresult.SlowPush
	toolResult(push, logs, phase, &res)
	Expect(res.Status).To(Equal(201), res.Body)
	Expect(res.Bytes).To(Equal(size))
	Expect(res.Restored).To(Equal(res.Sent), "the streamed version reads back different bytes")
	return res
}

// 9b. The workers' certificate is rotated while a backup streams: the backup commits, the worker
// serves the new certificate without a restart, and new connections trust it.
func tlsRotationSpecs() {
	Describe("9b. TLS certificate rotated mid-backup", Ordered, func() {
		It("keeps a backup running across a rotation and serves the new certificate without a restart", func() {
			const series = "stream"
			const size = 12 << 20
			ns := newNamespace("tls")
			Expect(k.Create(ctx, &backupv1alpha1.BackupSeries{
				ObjectMeta: metav1.ObjectMeta{Name: series, Namespace: ns},
				Spec: backupv1alpha1.BackupSeriesSpec{
					Source:  backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "e2e"}},
					Storage: backupv1alpha1.StorageSpec{Media: backupv1alpha1.MediaSSD},
				},
			})).To(Succeed())
			bs := waitSeriesReady(ns, series)
			Expect(bs.Status.Worker.Endpoint).To(HavePrefix("https://"))
			worker := workerPod("ssd", bs.Status.Worker.Node)
			oldSerial := workerCertSerial(Default)
			Expect(oldSerial).NotTo(BeEmpty())
			since := metav1.Now()

			By("a backup streaming 12 MiB over 45 s on one TLS connection")
			push := withToken(toolPod(ns, podName("slowpush"), "", "slowpush", "-server", bs.Status.Worker.Endpoint,
				"-series", ns+"/"+series, "-bytes", strconv.Itoa(size), "-seconds", "45", "-seed", runSeed(40)))
			startPod(push)
			Eventually(func(g Gomega) {
				calls := workerAPI(ns, bs.Status.Worker.Endpoint, "GET /v1/series/"+ns+"/"+series+"/backup")
				g.Expect(calls[0].Status).To(Equal(200), calls[0].Body)
				g.Expect(calls[0].Body).To(ContainSubstring(`"running":true`))
			}).WithTimeout(podTimeout).WithPolling(2 * time.Second).Should(Succeed())

			By("deleting Secret " + workerTLSSecret + ": the operator issues a new certificate")
			Expect(k.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: workerTLSSecret}})).To(Succeed())
			var newSerial string
			Eventually(func(g Gomega) {
				newSerial = workerCertSerial(g)
				g.Expect(newSerial).NotTo(BeEmpty())
				g.Expect(newSerial).NotTo(Equal(oldSerial))
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

			By("the worker reloads it, in the same pod, while the backup still streams")
			Eventually(func(g Gomega) {
				logs, err := cs.CoreV1().Pods(systemNS).GetLogs(worker.Name, &corev1.PodLogOptions{SinceTime: &since}).DoRaw(ctx)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(string(logs)).To(ContainSubstring("TLS certificate changed: reloaded"))
			}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
			p := &corev1.Pod{}
			Expect(k.Get(ctx, client.ObjectKeyFromObject(push), p)).To(Succeed())
			Expect(p.Status.Phase).NotTo(BeElementOf(corev1.PodSucceeded, corev1.PodFailed),
				"the backup ended before the worker reloaded its certificate: the rotation was not mid-backup")
			again := workerPod("ssd", bs.Status.Worker.Node)
			Expect(again.UID).To(Equal(worker.UID))
			Expect(again.Status.ContainerStatuses[0].RestartCount).To(Equal(worker.Status.ContainerStatuses[0].RestartCount))

			By("the backup that spanned the rotation committed and reads back byte-exact on a new connection")
			committedStream(push, size)

			By("a new pod with the namespace's bundle trusts the new certificate, and the operator still reaches the worker")
			calls := workerAPI(ns, bs.Status.Worker.Endpoint, "GET /v1/series/"+ns+"/"+series)
			Expect(calls[0].Status).To(Equal(200), calls[0].Body)
			Expect(strings.Contains(calls[0].Body, `"versions":1`)).To(BeTrue(), calls[0].Body)
			Eventually(func(g Gomega) {
				got := getSeries(ns, series)
				g.Expect(got.Status.Versions).To(HaveLen(1))
				g.Expect(condition(got.Status.Conditions, backupv1alpha1.ConditionPlaced).Status).To(Equal(metav1.ConditionTrue))
			}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		})
	})
}
