package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// annotateNode sets (or with "" removes) an annotation of a Node.
func annotateNode(node, key, value string) {
	GinkgoHelper()
	patchNode(node, func(n *corev1.Node) {
		if value == "" {
			delete(n.Annotations, key)
			return
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = value
	})
}

// 15. A storage node drained: the series on its worker move, with every version, to the other
// worker of their media through a real move Job; they restore byte-exact from there, backups go
// on there, and the drained worker keeps none of their versions.
func drainSpecs() {
	Describe("15. a storage node drained", Ordered, func() {
		var spare, ssdNode string

		BeforeAll(func() {
			// Cleanups run last-registered first: the drain mark goes, then any series still
			// on the spare (a failed spec), then the spare's label and stores.
			spare, ssdNode = spareAsSSD()
			DeferCleanup(func() { deleteSeriesOn(spare, backupv1alpha1.MediaSSD) })
			DeferCleanup(func() { annotateNode(spare, backupv1alpha1.DrainAnnotation, "") })
			workerPod("ssd", spare)
		})

		It("moves the drained node's series to the other ssd worker; every version restores byte-exact from there", func() {
			ns := newNamespace("e2e-15")
			createPVC(ns, "src")
			genTree(ns, "src", 150, 6, 12<<20)
			sum1 := sumTree(ns, "src")
			bs := newSeries(ns, "db", "src", backupv1alpha1.MediaSSD)
			bs.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			// A schedule that does not fire during the scenario: its CronJob must follow the move.
			bs.Spec.Schedule = "0 3 1 1 *"
			Expect(k.Create(ctx, bs)).To(Succeed())
			placeOn(ns, "db", spare, backupv1alpha1.MediaSSD)
			waitSeriesReady(ns, "db")
			backupNow(ns, "db", "one", 1)
			mutate(ns, "src", 151, 2, 4<<20)
			sum2 := sumTree(ns, "src")
			backupNow(ns, "db", "two", 2)

			before := getSeries(ns, "db").Status.Versions

			By("annotating node " + spare + " revault.io/drain=true")
			start := time.Now()
			annotateNode(spare, backupv1alpha1.DrainAnnotation, "true")
			Eventually(func(g Gomega) {
				cur := getSeries(ns, "db")
				g.Expect(cur.Status.Worker.Node).To(Equal(ssdNode))
				g.Expect(cur.Annotations[backupv1alpha1.PlacementAnnotation]).To(Equal("ssd/" + ssdNode))
				g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovedFromAnnotation), "the spare's copy is deleted")
				c := condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Reason).To(Equal("MovedCopyDeleted"), "Moving: %s", c.Message)
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(versionNumbers(cur)).To(Equal([]int64{1, 2}))
			}).WithTimeout(backupTimeout).WithPolling(poll).Should(Succeed())
			GinkgoWriter.Printf("moved 2 versions from %s to %s in %s\n", spare, ssdNode, time.Since(start).Round(time.Second))
			// No check of the MovedCopyDeleted event here: by then the series has sent more than
			// client-go's spam filter lets through for one object (a burst of 25), and it may be
			// dropped. The spare's copy is checked below instead.
			Expect(eventReasons(events(ns, "db"))).To(ContainElement("MoveStarted"))
			after := getSeries(ns, "db")
			for i, v := range after.Status.Versions {
				Expect(v.Number).To(Equal(before[i].Number))
				Expect(v.Time.Equal(&before[i].Time)).To(BeTrue(), "version %d keeps its time", v.Number)
				Expect(v.LogicalBytes).To(Equal(before[i].LogicalBytes))
			}
			By("the CronJob runs again, against the new worker")
			Eventually(func(g Gomega) {
				cj := &batchv1.CronJob{}
				g.Expect(k.Get(ctx, client.ObjectKey{Namespace: ns, Name: "db-backup"}, cj)).To(Succeed())
				g.Expect(*cj.Spec.Suspend).To(BeFalse())
				g.Expect(cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args).To(ContainElement(after.Status.Worker.Endpoint))
			}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

			By("no series of the drained node's worker is left there")
			calls := workerAPI(ns, workerEndpoint("ssd", spare), "GET /v1/series/"+ns+"/db")
			Expect(calls[0].Status).To(Equal(200), "%s", calls[0].Body)
			Expect(calls[0].Body).To(ContainSubstring(`"versions":0`))
			// Sealed: the spare's worker refuses the series' backups, naming the new worker.
			Expect(calls[0].Body).To(ContainSubstring(`"movedTo":"` + getSeries(ns, "db").Status.Worker.Endpoint + `"`))

			By("every version restores byte-exact from the new worker, and backups go on there")
			expectRestore(ns, "restore-one", "db", "1", 1, sum1, "version 1, moved")
			expectRestore(ns, "restore-two", "db", "2", 2, sum2, "version 2, moved")
			mutate(ns, "src", 152, 1, 0)
			sum3 := sumTree(ns, "src")
			backupNow(ns, "db", "three", 3)
			Expect(getSeries(ns, "db").Status.Worker.Node).To(Equal(ssdNode))
			expectRestore(ns, "restore-three", "db", "3", 3, sum3, "version 3, backed up after the move")
		})
	})
}
