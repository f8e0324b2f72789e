package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

var _ = Describe("A backup its worker holds back", func() {
	BeforeEach(requireWorkers)

	// The suite's workers run one backup at a time (--max-backups 1).
	It("shows the series Queued while the worker's backup slots are taken, then commits it", func() {
		ns := newNamespace("queued")
		bs := placedSeries(pvcSeries(ns, "db"))
		node := bs.Status.Worker.Node

		By("taking the worker's only slot with another series' backup, left open")
		waitToken(ns, node)
		finishHolder := startStdinPush(ns, "holder", node, func(i, j int) byte { return byte(i*5 + j*3 + j>>8) })
		holderDone := false
		DeferCleanup(func() {
			if !holderDone {
				finishHolder()
			}
		})

		By("running the series' on-demand Job: its push waits for the slot")
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "now")
		Eventually(func() int { return len(backupJobs(ns, "db")) }).Should(Equal(1))
		job := backupJobs(ns, "db")[0]
		src := randomTree(256)
		type result struct {
			out string
			ok  bool
		}
		done := make(chan result, 1)
		go func() {
			defer GinkgoRecover()
			out, ok := runJobPod(&job, ns, node, src)
			done <- result{out, ok}
		}()
		Eventually(func() backupv1alpha1.BackupSeriesPhase { return getSeries(ns, "db").Status.Phase }).
			WithTimeout(30 * time.Second).Should(Equal(backupv1alpha1.SeriesQueued))
		Consistently(done).WithTimeout(2*time.Second).ShouldNot(Receive(), "the push ran although the slot was taken")

		By("freeing the slot: the push runs and commits, and the series is Ready with its version")
		finishHolder()
		holderDone = true
		var r result
		Eventually(done).WithTimeout(60 * time.Second).Should(Receive(&r))
		Expect(r.ok).To(BeTrue(), r.out)
		finishJob(&job, true, r.out)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.SeriesReady))
			g.Expect(st.VersionCount).To(BeEquivalentTo(1))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		sameTree(src, pull(ns, "db", node, 1))
	})
})
