package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// moveJobOf waits for the series' move Job.
func moveJobOf(ns, name string) *batchv1.Job {
	GinkgoHelper()
	var job *batchv1.Job
	Eventually(func(g Gomega) {
		var jobs batchv1.JobList
		g.Expect(k8sClient.List(ctx, &jobs, client.InNamespace(ns),
			client.MatchingLabels{plan.LabelComponent: plan.ComponentMove, plan.LabelSeries: name})).To(Succeed())
		g.Expect(jobs.Items).To(HaveLen(1))
		job = &jobs.Items[0]
	}).WithTimeout(20 * time.Second).Should(Succeed())
	return job
}

// runMovePod plays a move Job's pod: its own arguments, with the two workers' loopback URLs and
// a token file in place of the in-cluster ones.
func runMovePod(job *batchv1.Job, ns, from, to string) (string, bool) {
	waitToken(ns, to)
	args := append([]string(nil), job.Spec.Template.Spec.Containers[0].Args...)
	for i := 1; i < len(args); i++ {
		switch args[i-1] {
		case "--from":
			args[i] = workerURL[from]
		case "--to":
			args[i] = workerURL[to]
		case "--token-file":
			args[i] = nsTokenFile(ns)
		}
	}
	out, errOut, ok := runRevault(args...)
	return out + errOut, ok
}

// storageNode is the Ready, storage-labelled Node of a suite worker, made for the test that
// needs it (and deleted after it) unless another test made it already.
func storageNode(name string) *corev1.Node {
	GinkgoHelper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{backupv1alpha1.StorageLabel: "ssd"}}}
	err := k8sClient.Create(ctx, node)
	if apierrors.IsAlreadyExists(err) {
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(node), node)).To(Succeed())
		return node
	}
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, node))).To(Succeed()) })
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
	return node
}

// movingSeries makes a series of a new namespace (prefix) with one version of kib KiB, asks for
// its move to any other worker, and returns once the move Job exists: the namespace, the
// series, its node, the destination the Job names, and the Job.
func movingSeries(prefix string, kib int) (ns string, bs *backupv1alpha1.BackupSeries, from, to string, job *batchv1.Job) {
	GinkgoHelper()
	ns = newNamespace(prefix)
	bs = placedSeries(pvcSeries(ns, "db"))
	from = bs.Status.Worker.Node
	push(ns, "db", from, randomTree(kib))
	annotate(bs, backupv1alpha1.MoveToAnnotation, "any")
	job = moveJobOf(ns, "db")
	to = otherSSD(from)
	Expect(job.Annotations[plan.AnnotationMoveTo]).To(Equal("ssd/" + to))
	return ns, bs, from, to, job
}

// otherSSD is the suite's other SSD node.
func otherSSD(node string) string {
	if node == "node-ssd-1" {
		return "node-ssd-2"
	}
	return "node-ssd-1"
}

// versionNumbers lists the version numbers node's worker holds of ns/name (none when it
// holds no such series).
func versionNumbers(node, ns, name string) []int64 {
	d, err := adminClient(node).Series(ctx, ns, name)
	if err != nil {
		return nil
	}
	var out []int64
	for _, v := range d.VersionList {
		out = append(out, v.Number)
	}
	return out
}

var _ = Describe("Moving a series between workers", Ordered, func() {
	BeforeEach(requireWorkers)

	It("moves a series on revault.io/move-to with its whole history, holding backups meanwhile, and deletes the source's copy", func() {
		ns := newNamespace("move")
		bs := pvcSeries(ns, "db")
		bs.Spec.Schedule = "0 2 * * *"
		bs = placedSeries(bs)
		from := bs.Status.Worker.Node
		to := otherSSD(from)
		// Both are storage nodes, as in a cluster (a node that is not counts as gone).
		storageNode(from)
		storageNode(to)
		push(ns, "db", from, randomTree(256))
		push(ns, "db", from, randomTree(256))
		Expect(workerclient.Done(workerClient(from, adminToken()).DeleteVersionWithResponse(ctx, ns, "db", "1"))).To(Succeed())
		push(ns, "db", from, randomTree(128))
		Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).WithTimeout(20 * time.Second).Should(BeEquivalentTo(2))
		before := versionNumbers(from, ns, "db")
		Expect(before).To(Equal([]int64{2, 3}))

		annotate(bs, backupv1alpha1.MoveToAnnotation, to)
		job := moveJobOf(ns, "db")
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Phase).To(Equal(backupv1alpha1.SeriesMoving))
			g.Expect(cur.Annotations[backupv1alpha1.MovingAnnotation]).To(Equal("ssd/" + to))
			c := condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving)
			g.Expect(c.Reason).To(Equal("Copying"))
			cj := &batchv1.CronJob{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.CronJobName("db")}, cj)).To(Succeed())
			g.Expect(*cj.Spec.Suspend).To(BeTrue(), "no scheduled backup while the series moves")
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(job.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--keep-source"))

		out, ok := runMovePod(job, ns, from, to)
		Expect(ok).To(BeTrue(), out)
		Expect(versionNumbers(from, ns, "db")).To(Equal(before), "the Job keeps the source's copy")
		finishJob(job, true, out)

		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Worker.Node).To(Equal(to))
			g.Expect(cur.Annotations[backupv1alpha1.PlacementAnnotation]).To(Equal("ssd/" + to))
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovingAnnotation))
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MoveToAnnotation))
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovedFromAnnotation), "the source's copy is deleted")
			g.Expect(cur.Status.Phase).To(Equal(backupv1alpha1.SeriesReady))
			g.Expect(condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving).Reason).To(Equal("MovedCopyDeleted"))
			cj := &batchv1.CronJob{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.CronJobName("db")}, cj)).To(Succeed())
			g.Expect(*cj.Spec.Suspend).To(BeFalse())
			g.Expect(cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args).To(ContainElement(cur.Status.Worker.Endpoint))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(versionNumbers(to, ns, "db")).To(Equal(before))
		Expect(versionNumbers(from, ns, "db")).To(BeEmpty())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{})
		}).Should(Satisfy(apierrors.IsNotFound), "the finished move Job is deleted")
		// Backups go on at the destination, numbered after the moved versions.
		push(ns, "db", to, randomTree(64))
		Expect(versionNumbers(to, ns, "db")).To(Equal([]int64{2, 3, 4}))
		Eventually(func() []string { return eventReasons(bs) }).Should(ContainElement("MoveStarted"))

		By("the old worker refusing the series' backups, naming the new one")
		pout, perr, pok := runRevault("--quiet", "push", "--server", workerURL[from], "--token-file", nsTokenFile(ns),
			"--series", plan.SeriesID(ns, "db"), randomTree(32))
		Expect(pok).To(BeFalse(), pout)
		Expect(perr).To(ContainSubstring("was moved to " + getSeries(ns, "db").Status.Worker.Endpoint))

		By("keeping a source's copy that holds a version the destination lacks")
		// A version that reached the old worker anyway (its seal taken away by hand here): that
		// copy is not deleted, and a warning names the version.
		Expect(adminClient(from).SetMovedTo(ctx, ns, "db", nil)).To(Succeed())
		push(ns, "db", from, randomTree(32))
		Expect(versionNumbers(from, ns, "db")).To(Equal([]int64{4}))
		annotate(bs, backupv1alpha1.MovedFromAnnotation, "ssd/"+from+"@3")
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionMoving)
			g.Expect(c.Reason).To(Equal("MovedCopyOnly"))
			g.Expect(c.Message).To(ContainSubstring("node " + from + " holds version(s) 4 of the series, written there after the move"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(versionNumbers(from, ns, "db")).To(Equal([]int64{4}))
		Expect(getSeries(ns, "db").Annotations).To(HaveKey(backupv1alpha1.MovedFromAnnotation))

		By("deleting the series with deletionPolicy Delete: both copies go")
		updateSeries(ns, "db", func(sp *backupv1alpha1.BackupSeriesSpec) { sp.DeletionPolicy = backupv1alpha1.DeletionDelete })
		Expect(k8sClient.Delete(ctx, getSeries(ns, "db"))).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{})
		}).WithTimeout(20 * time.Second).Should(Satisfy(apierrors.IsNotFound))
		Expect(versionNumbers(to, ns, "db")).To(BeEmpty())
		Expect(versionNumbers(from, ns, "db")).To(BeEmpty(), "the copy a move left behind is deleted too")
	})

	It("copies again when a version reaches the source during the copy", func() {
		ns, _, from, to, job := movingSeries("moverace", 128)
		out, ok := runMovePod(job, ns, from, to)
		Expect(ok).To(BeTrue(), out)
		// An external producer's push lands on the source after the copy listed its versions.
		push(ns, "db", from, randomTree(64))
		finishJob(job, true, out)
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving).Reason).To(Equal("SourceChanged"))
			g.Expect(cur.Status.Worker.Node).To(Equal(from), "not switched to a destination that lacks a version")
		}).WithTimeout(20 * time.Second).Should(Succeed())
		clock.Advance(moveRetryAfter + time.Second)
		DeferCleanup(func() { clock.Advance(-moveRetryAfter - time.Second) })
		Eventually(func(g Gomega) {
			j := moveJobOf(ns, "db")
			g.Expect(j.UID).NotTo(Equal(job.UID))
			job = j
		}).WithTimeout(20 * time.Second).Should(Succeed())
		out, ok = runMovePod(job, ns, from, to)
		Expect(ok).To(BeTrue(), out)
		finishJob(job, true, out)
		Eventually(func() string { return getSeries(ns, "db").Status.Worker.Node }).WithTimeout(20 * time.Second).Should(Equal(to))
		Expect(versionNumbers(to, ns, "db")).To(Equal([]int64{1, 2}))
	})

	It("cancels a move no longer asked for: the copy Job and the partial copy go, the series stays", func() {
		ns, bs, from, to, job := movingSeries("movecancel", 64)
		// The copy ran (its Job not finished yet), and the source was sealed as a switch that
		// crashed after the seal leaves it, when the move is called off.
		out, ok := runMovePod(job, ns, from, to)
		Expect(ok).To(BeTrue(), out)
		Expect(versionNumbers(to, ns, "db")).To(Equal([]int64{1}))
		Expect(adminClient(from).SetMovedTo(ctx, ns, "db", ptr.To(workerURL[to]))).To(Succeed())
		annotate(bs, backupv1alpha1.MoveToAnnotation, "")
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovingAnnotation))
			g.Expect(condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving).Reason).To(Equal("Cancelled"))
			g.Expect(cur.Status.Worker.Node).To(Equal(from))
			g.Expect(cur.Status.Phase).To(Equal(backupv1alpha1.SeriesReady))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{})
		}).Should(Satisfy(apierrors.IsNotFound))
		Expect(versionNumbers(from, ns, "db")).To(Equal([]int64{1}))
		Expect(versionNumbers(to, ns, "db")).To(BeEmpty())
		// The source takes backups again: the cancel took its seal away.
		push(ns, "db", from, randomTree(16))
		Expect(versionNumbers(from, ns, "db")).To(Equal([]int64{1, 2}))
	})

	It("finishes a switch whose status write was lost, from the annotations", func() {
		ns := newNamespace("moveroll")
		bs := placedSeries(pvcSeries(ns, "db"))
		from := bs.Status.Worker.Node
		to := otherSSD(from)
		storageNode(from)
		storageNode(to)
		push(ns, "db", from, randomTree(64))
		push(ns, "db", from, randomTree(64))
		// What a move Job does, then the switch's annotations without its status write.
		waitToken(ns, to)
		out, errOut, ok := runRevault("--json", "--quiet", "move", plan.SeriesID(ns, "db"), "--from", workerURL[from],
			"--to", workerURL[to], "--token-file", nsTokenFile(ns), "--keep-source")
		Expect(ok).To(BeTrue(), out+errOut)
		// The placement record first, as the switch writes both in one patch: a note naming the
		// series' own worker alone would be dropped as written by hand.
		annotate(bs, backupv1alpha1.PlacementAnnotation, "ssd/"+to)
		annotate(bs, backupv1alpha1.MovedFromAnnotation, "ssd/"+from+"@2")
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Worker.Node).To(Equal(to), "the switch is rolled forward, not read as a move back")
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovedFromAnnotation))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(versionNumbers(to, ns, "db")).To(Equal([]int64{1, 2}))
		Expect(versionNumbers(from, ns, "db")).To(BeEmpty())
	})

	It("moves a drained node's series away, places nothing new there, and keeps a failed copy's series where it was", func() {
		ns := newNamespace("drain")
		bs := placedSeries(pvcSeries(ns, "db"))
		from := bs.Status.Worker.Node
		push(ns, "db", from, randomTree(128))
		node := storageNode(from)
		annotate(node, backupv1alpha1.DrainAnnotation, "true")
		DeferCleanup(func() { annotate(node, backupv1alpha1.DrainAnnotation, "") })

		job := moveJobOf(ns, "db")
		// Once the operator has seen the drain (it started the move), nothing new goes there.
		other := placedSeries(pvcSeries(ns, "other"))
		Expect(other.Status.Worker.Node).NotTo(Equal(from), "a new series is not placed on a drained node")
		to := otherSSD(from)
		Expect(job.Annotations[plan.AnnotationMoveTo]).To(Equal("ssd/" + to))
		// The copy fails: the series stays on its worker and backups may run there again.
		finishJob(job, false, `{"error":"uploading to the destination: connection reset"}`)
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Worker.Node).To(Equal(from))
			c := condition(cur.Status.Conditions, backupv1alpha1.ConditionMoving)
			g.Expect(c.Reason).To(Equal("MoveFailed"))
			g.Expect(c.Message).To(ContainSubstring("connection reset"))
			g.Expect(cur.Status.Phase).NotTo(Equal(backupv1alpha1.SeriesMoving))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(versionNumbers(from, ns, "db")).To(Equal([]int64{1}))

		// Later, the copy is tried again, and this time it runs.
		clock.Advance(moveRetryAfter + time.Second)
		DeferCleanup(func() { clock.Advance(-moveRetryAfter - time.Second) })
		Eventually(func(g Gomega) {
			j := moveJobOf(ns, "db")
			g.Expect(j.UID).NotTo(Equal(job.UID))
			job = j
		}).WithTimeout(20 * time.Second).Should(Succeed())
		out, ok := runMovePod(job, ns, from, to)
		Expect(ok).To(BeTrue(), out)
		finishJob(job, true, out)
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Worker.Node).To(Equal(to))
			g.Expect(cur.Annotations).NotTo(HaveKey(backupv1alpha1.MovedFromAnnotation))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(versionNumbers(to, ns, "db")).To(Equal([]int64{1}))
	})
})
