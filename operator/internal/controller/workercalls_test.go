package controller

import (
	"fmt"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// hungNode's worker accepts connections and never answers (see startHungWorker).
const hungNode = "node-hung"

// testCallLimits are the suite's bounds on worker calls: short, so a hung worker shows quickly,
// but long enough that a real worker on a loaded machine is not taken for a hung one.
var testCallLimits = CallLimits{Quick: 5 * time.Second, Heavy: 30 * time.Second, Pause: 5 * time.Second}

// startHungWorker listens on loopback, accepts every connection and holds it without a byte
// in answer (a worker stuck in the kernel, or its node half-partitioned); returns its URL.
func startHungWorker() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	held := make(chan net.Conn, 4096)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	DeferCleanup(func() {
		_ = l.Close()
		for {
			select {
			case c := <-held:
				_ = c.Close()
			default:
				return
			}
		}
	})
	return fmt.Sprintf("http://%s", l.Addr())
}

var _ = Describe("Worker calls", func() {
	It("lets a worker that hangs stall none of the series on other workers", func() {
		requireWorkers()
		ns := newNamespace("hung")
		// Six series whose worker hangs: more than the reconciles that run at once.
		for i := range 6 {
			bs := placedSeries(pvcSeries(ns, fmt.Sprintf("stuck-%d", i)))
			Eventually(func() error {
				cur := getSeries(ns, bs.Name)
				cur.Status.Worker.Node = hungNode
				return k8sClient.Status().Update(ctx, cur)
			}).Should(Succeed())
		}
		// Each says which worker did not answer, and how long it waited.
		for i := range 6 {
			Eventually(func(g Gomega) {
				c := condition(getSeries(ns, fmt.Sprintf("stuck-%d", i)).Status.Conditions, backupv1alpha1.ConditionSynced)
				g.Expect(c.Status).To(BeEquivalentTo("False"))
				g.Expect(c.Message).To(MatchRegexp(`the worker at %s did not answer [a-z_]+ within 5s`, workerURL[hungNode]))
			}).WithTimeout(20 * time.Second).Should(Succeed())
		}
		// Once one call waited its bound, the others fail at once: a pause, not a wait each.
		Expect(metricValue("revault_operator_worker_requests_total", "operation=series", "outcome=skipped") +
			metricValue("revault_operator_worker_requests_total", "operation=list_series", "outcome=skipped")).
			To(BeNumerically(">", 0))
		// Meanwhile a new series on a worker that answers is placed, read back and Ready, and
		// an existing one keeps being read back.
		start := time.Now()
		placedSeries(pvcSeries(ns, "healthy"))
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "healthy").Status.Conditions, backupv1alpha1.ConditionSynced)
			g.Expect(c.Status).To(BeEquivalentTo("True"), c.Message)
		}).WithTimeout(10 * time.Second).Should(Succeed())
		GinkgoWriter.Printf("a new series beside six on a hung worker was synced after %s\n", time.Since(start))
		// The stuck series go (Retain: their finalizer asks no worker), so they do not go on
		// calling the hung worker during the other specs.
		for i := range 6 {
			Expect(k8sClient.Delete(ctx, getSeries(ns, fmt.Sprintf("stuck-%d", i)))).To(Succeed())
		}
	})
})
