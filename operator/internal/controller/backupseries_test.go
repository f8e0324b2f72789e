package controller

import (
	"os"
	"path/filepath"
	"strings"
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

func backupJobs(ns, series string) []batchv1.Job {
	var jobs batchv1.JobList
	Expect(k8sClient.List(ctx, &jobs, client.InNamespace(ns),
		client.MatchingLabels{plan.LabelComponent: plan.ComponentBackup, plan.LabelSeries: series})).To(Succeed())
	return jobs.Items
}

// expectNoData checks that node's worker holds no version of ns/name.
func expectNoData(node, ns, name string) {
	s, err := adminClient(node).Series(ctx, ns, name)
	if workerclient.IsNotFound(err) {
		return
	}
	Expect(err).NotTo(HaveOccurred())
	Expect(s.VersionList).To(BeEmpty(), "the worker still has versions of %s/%s", ns, name)
}

var _ = Describe("BackupSeries", func() {
	BeforeEach(requireWorkers)

	It("is placed on a worker, backs up on schedule and on demand, and reports the worker's versions", func() {
		ns := newNamespace("bs")
		bs := pvcSeries(ns, "db")
		bs.Spec.Schedule = "0 2 * * *"
		bs = placedSeries(bs)
		w := bs.Status.Worker
		Expect(w.Media).To(Equal(backupv1alpha1.MediaSSD))
		Expect(w.Node).To(BeElementOf("node-ssd-1", "node-ssd-2"))
		Expect(w.Pod).To(Equal("revault-worker-ssd-" + w.Node))
		endpoint := "http://revault-worker-ssd-" + w.Node + ".revault-system.svc:8420"
		Expect(w.Endpoint).To(Equal(endpoint))
		Expect(bs.Finalizers).To(ContainElement(backupv1alpha1.SeriesFinalizer))

		By("scheduling backups with a CronJob that pushes the read-only PVC to the worker")
		cj := &batchv1.CronJob{}
		Eventually(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db-backup"}, cj)
		}).Should(Succeed())
		Expect(cj.Spec.Schedule).To(Equal("0 2 * * *"))
		Expect(metav1.IsControlledBy(cj, bs)).To(BeTrue())
		pod := cj.Spec.JobTemplate.Spec.Template.Spec
		Expect(strings.Join(pod.Containers[0].Args, " ")).To(Equal(
			"--json --quiet push --server " + endpoint + " --token-file /etc/revault/token --series " + ns + "/db --unit segment /data"))
		Expect(pod.Volumes[0].PersistentVolumeClaim.ClaimName).To(Equal("db-data"))
		Expect(pod.Volumes[0].PersistentVolumeClaim.ReadOnly).To(BeTrue())

		By("giving the namespace a scoped token that the worker accepts for this namespace only")
		sec := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.NamespaceTokenSecret}, sec)).To(Succeed())
		nsToken := string(sec.Data[plan.NamespaceTokenKey])
		wsec := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerTokensSecret}, wsec)).To(Succeed())
		Expect(string(wsec.Data[plan.WorkerTokensKey])).To(ContainSubstring(nsToken + " " + ns + "\n"))
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionTokenReady)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("running a Job for each new value of the backup-now annotation")
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "first")
		Eventually(func() []batchv1.Job { return backupJobs(ns, "db") }).Should(HaveLen(1))
		Eventually(func() string { return getSeries(ns, "db").Status.LastBackupNow }).Should(Equal("first"))
		Eventually(func() backupv1alpha1.BackupSeriesPhase { return getSeries(ns, "db").Status.Phase }).
			Should(Equal(backupv1alpha1.SeriesBackingUp))
		job1 := backupJobs(ns, "db")[0]
		Expect(job1.Name).To(Equal(plan.BackupNowJobName("db", "first")))
		Expect(strings.Join(job1.Spec.Template.Spec.Containers[0].Args, " ")).To(ContainSubstring("push --server " + endpoint))
		Consistently(func() []batchv1.Job { return backupJobs(ns, "db") }).WithTimeout(2 * time.Second).Should(HaveLen(1))

		By("reading versions and sizes back from the worker after the Job's push")
		src := randomTree(512)
		report := push(ns, "db", w.Node, src)
		succeededBefore := metricValue("revault_operator_backup_jobs_total", "result=succeeded")
		finishJob(&job1, true, report)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.VersionCount).To(BeEquivalentTo(1))
			g.Expect(st.Versions).To(HaveLen(1))
			g.Expect(st.Versions[0].Number).To(BeEquivalentTo(1))
			g.Expect(st.Versions[0].LogicalBytes).To(BeNumerically(">=", 512*1024))
			g.Expect(st.Versions[0].StoredBytes).To(BeNumerically(">", 0))
			g.Expect(st.LastBackup).NotTo(BeNil())
			g.Expect(st.DedupRatio).NotTo(BeEmpty())
			g.Expect(st.LastJob).NotTo(BeNil())
			g.Expect(st.LastJob.Succeeded).To(BeTrue())
			g.Expect(st.Phase).To(Equal(backupv1alpha1.SeriesReady))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionBackupSucceeded).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionSynced).Status).To(Equal(metav1.ConditionTrue))
			ready := condition(st.Conditions, backupv1alpha1.ConditionReady)
			g.Expect(ready.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(ready.ObservedGeneration).To(Equal(getSeries(ns, "db").Generation))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// The reconciler counts the Job right after its status write, which the test may see first.
		Eventually(func() float64 { return metricValue("revault_operator_backup_jobs_total", "result=succeeded") }).
			Should(Equal(succeededBefore + 1))
		Expect(metricValue("revault_operator_backupseries", "phase=Ready")).To(BeNumerically(">=", 1))
		Expect(metricValue("revault_operator_reconcile_outcomes_total", "controller=backupseries", "outcome=success")).To(BeNumerically(">", 0))

		By("a second backup of the same data deduplicates")
		push(ns, "db", w.Node, src)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.VersionCount).To(BeEquivalentTo(2))
			g.Expect(st.Versions[1].LogicalBytes).To(Equal(st.Versions[0].LogicalBytes))
			g.Expect(st.Versions[1].StoredBytes).To(BeNumerically("<", st.Versions[0].StoredBytes/10))
			g.Expect(st.LatestVersion).To(BeEquivalentTo(2))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("reporting a failed backup with the worker's message")
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "second")
		var job2 batchv1.Job
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.BackupNowJobName("db", "second")}, &job2)).To(Succeed())
		}).Should(Succeed())
		bad := filepath.Join(scratch, "bad-token")
		Expect(os.WriteFile(bad, []byte("not-a-token\n"), 0o600)).To(Succeed())
		out, errOut, ok := runRevault("--json", "--quiet", "push", "--server", workerURL[w.Node], "--token-file", bad,
			"--series", ns+"/db", src)
		Expect(ok).To(BeFalse())
		failure := plan.ParseJobOutput(out + errOut).Error
		Expect(failure).NotTo(BeEmpty())
		finishJob(&job2, false, out+errOut)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.SeriesFailed))
			c := condition(st.Conditions, backupv1alpha1.ConditionBackupSucceeded)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring(failure))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []string { return eventReasons(bs) }).Should(ContainElements("WorkerSelected", "ScheduleCreated", "BackupStarted", "JobFailed", "PhaseFailed"))

		By("removing the CronJob when the schedule goes")
		updateSeries(ns, "db", func(s *backupv1alpha1.BackupSeriesSpec) { s.Schedule = "" })
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db-backup"}, &batchv1.CronJob{}))
		}).Should(BeTrue())
	})

	It("places a series on the worker of its media with the most room, then the least used", func() {
		ns := newNamespace("place")
		// Make the two SSD workers differ: write unique data to the emptier one's scratch series
		// until one clearly holds more.
		s1, err := adminClient("node-ssd-1").Stats(ctx)
		Expect(err).NotTo(HaveOccurred())
		s2, err := adminClient("node-ssd-2").Stats(ctx)
		Expect(err).NotTo(HaveOccurred())
		if s1.ContainerBytes == s2.ContainerBytes {
			fill := newNamespace("fill")
			placedSeries(pvcSeries(fill, "x")) // gives the namespace a token
			push(fill, "filler", "node-ssd-1", randomTree(1024))
			s1, _ = adminClient("node-ssd-1").Stats(ctx)
		}
		emptier := "node-ssd-1"
		if s2.ContainerBytes < s1.ContainerBytes {
			emptier = "node-ssd-2"
		}
		bs := placedSeries(pvcSeries(ns, "one"))
		Expect(bs.Status.Worker.Node).To(Equal(emptier))
		Expect(condition(bs.Status.Conditions, backupv1alpha1.ConditionPlaced).Status).To(Equal(metav1.ConditionTrue))
		Eventually(func() []string { return eventNotes(bs) }).Should(ContainElement(
			HavePrefix("WorkerSelected: Placed is True: ssd worker with the most room: node " + emptier)))

		hdd := pvcSeries(ns, "cold")
		hdd.Spec.Storage.Media = backupv1alpha1.MediaHDD
		hdd = placedSeries(hdd)
		Expect(hdd.Status.Worker.Node).To(Equal("node-hdd-1"))
		Expect(hdd.Status.Worker.Endpoint).To(Equal("http://revault-worker-hdd-node-hdd-1.revault-system.svc:8420"))
	})

	It("waits in Pending while no worker of its media is ready", func() {
		ns := newNamespace("pending")
		pod := workerPod("node-hdd-1", backupv1alpha1.MediaHDD)
		setPodReady(pod, false)
		defer setPodReady(pod, true)
		bs := pvcSeries(ns, "cold")
		bs.Spec.Storage.Media = backupv1alpha1.MediaHDD
		Expect(k8sClient.Create(ctx, bs)).To(Succeed())
		Eventually(func(g Gomega) {
			st := getSeries(ns, "cold").Status
			g.Expect(st.Phase).To(Equal(backupv1alpha1.SeriesPending))
			c := condition(st.Conditions, backupv1alpha1.ConditionPlaced)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("NoWorker"))
			g.Expect(c.Message).To(ContainSubstring("pod revault-worker-hdd-node-hdd-1 not ready"))
		}).Should(Succeed())
		setPodReady(pod, true)
		Eventually(func() *backupv1alpha1.WorkerPlacement { return getSeries(ns, "cold").Status.Worker }).
			WithTimeout(30 * time.Second).ShouldNot(BeNil())
	})

	It("records its placement and follows the record when its status is lost, even to a worker that is down", func() {
		ns := newNamespace("record")
		bs := placedSeries(pvcSeries(ns, "db"))
		node := bs.Status.Worker.Node
		Eventually(func() string { return getSeries(ns, "db").Annotations[backupv1alpha1.PlacementAnnotation] }).
			Should(Equal("ssd/" + node))
		push(ns, "db", node, randomTree(64))
		loseStatus := func(record string) {
			Eventually(func() error {
				cur := getSeries(ns, "db")
				cur.Annotations[backupv1alpha1.PlacementAnnotation] = record
				return k8sClient.Update(ctx, cur)
			}).Should(Succeed())
			Eventually(func() error {
				cur := getSeries(ns, "db")
				cur.Status = backupv1alpha1.BackupSeriesStatus{}
				return k8sClient.Status().Update(ctx, cur)
			}).Should(Succeed())
		}
		// Restored without status while the worker holding it is down: it waits for that
		// worker rather than starting a second history elsewhere.
		pod := workerPod(node, backupv1alpha1.MediaSSD)
		setPodReady(pod, false)
		defer setPodReady(pod, true)
		loseStatus("ssd/" + node)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			c := condition(st.Conditions, backupv1alpha1.ConditionPlaced)
			g.Expect(c.Reason).To(Equal("RecordedWorkerMissing"), c.Message)
			g.Expect(c.Message).To(ContainSubstring("kubectl annotate backupseries db revault.io/placement-"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Consistently(func() *backupv1alpha1.WorkerPlacement { return getSeries(ns, "db").Status.Worker }).
			WithTimeout(3 * time.Second).Should(BeNil())
		// The worker is back: so is the series, with its version.
		setPodReady(pod, true)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.Worker).NotTo(BeNil())
			g.Expect(st.Worker.Node).To(Equal(node))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionPlaced).Reason).To(Equal("WorkerSelected"))
			g.Expect(st.VersionCount).To(BeEquivalentTo(1))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		// A record naming a node this cluster does not have (restored elsewhere) is not
		// followed: the worker that holds the series is found by asking.
		loseStatus("ssd/node-nowhere")
		Eventually(func(g Gomega) {
			cur := getSeries(ns, "db")
			g.Expect(cur.Status.Worker).NotTo(BeNil())
			g.Expect(cur.Status.Worker.Node).To(Equal(node))
			g.Expect(cur.Annotations[backupv1alpha1.PlacementAnnotation]).To(Equal("ssd/" + node))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("adopts the worker that already holds the series", func() {
		ns := newNamespace("adopt")
		// The data arrives before the BackupSeries (e.g. the object was restored from a cluster
		// backup and lost its status): the series must go back to that worker.
		placedSeries(pvcSeries(ns, "token-holder"))
		push(ns, "db", "node-ssd-2", randomTree(64))
		bs := placedSeries(pvcSeries(ns, "db"))
		Expect(bs.Status.Worker.Node).To(Equal("node-ssd-2"))
		Eventually(func() []string { return eventNotes(bs) }).Should(ContainElement(
			"Adopted: Placed is True: the ssd worker on node node-ssd-2 already holds series " + ns + "/db"))
		Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(1))
	})

	It("reports external series and ignores backup-now for them", func() {
		ns := newNamespace("ext")
		bs := &backupv1alpha1.BackupSeries{
			ObjectMeta: metav1.ObjectMeta{Name: "velero-pvc", Namespace: ns},
			Spec: backupv1alpha1.BackupSeriesSpec{
				Source: backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "velero"}},
			},
		}
		bs = placedSeries(bs)
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "now")
		Eventually(func() []string { return eventReasons(bs) }).Should(ContainElement("BackupNowIgnored"))
		Expect(backupJobs(ns, "velero-pvc")).To(BeEmpty())
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "velero-pvc-backup"}, &batchv1.CronJob{}))).To(BeTrue())
		push(ns, "velero-pvc", bs.Status.Worker.Node, randomTree(64))
		Eventually(func() int32 { return getSeries(ns, "velero-pvc").Status.VersionCount }).Should(BeEquivalentTo(1))
	})

	It("flags a schedule the cron parser rejects and runs no CronJob for it", func() {
		ns := newNamespace("cron")
		bs := pvcSeries(ns, "db")
		bs.Spec.Schedule = "61 * * * *" // the right shape, an impossible minute
		placedSeries(bs)
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			c := condition(st.Conditions, backupv1alpha1.ConditionScheduleValid)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("InvalidSchedule"))
			g.Expect(c.Message).To(ContainSubstring(`schedule "61 * * * *" is not a valid cron schedule`))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionReady).Reason).To(Equal("InvalidSchedule"))
		}).Should(Succeed())
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db-backup"}, &batchv1.CronJob{}))).To(BeTrue())
	})

	It("runs its schedule in its time zone, says when the next backup is due, and when backups are overdue", func() {
		ns := newNamespace("tz")
		bs := pvcSeries(ns, "db")
		bs.Spec.Schedule, bs.Spec.TimeZone = "* * * * *", ptr.To("Asia/Kolkata")
		placedSeries(bs)
		Eventually(func(g Gomega) {
			cj := &batchv1.CronJob{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db-backup"}, cj)).To(Succeed())
			g.Expect(cj.Spec.TimeZone).To(HaveValue(Equal("Asia/Kolkata")))
			st := getSeries(ns, "db").Status
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionScheduleValid).Message).To(ContainSubstring("(Asia/Kolkata)"))
			g.Expect(st.NextBackup).NotTo(BeNil())
			g.Expect(st.NextBackup.Time).To(BeTemporally(">", clock.Now().Add(-2*time.Second)))
			g.Expect(st.NextBackup.Time).To(BeTemporally("<=", clock.Now().Add(61*time.Second)))
			c := condition(st.Conditions, backupv1alpha1.ConditionBackupOverdue)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("OnSchedule"))
			g.Expect(c.Message).To(ContainSubstring("since the series was created"))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("flagging the series once two runs passed without a backup")
		clock.Advance(5 * time.Minute)
		restored := false
		restore := func() {
			if !restored {
				clock.Advance(-5 * time.Minute)
				restored = true
			}
		}
		defer restore()
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionBackupOverdue)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal("NoRecentBackup"))
			g.Expect(c.Message).To(ContainSubstring(`two runs of schedule "* * * * *" (Asia/Kolkata) have passed`))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []string { return eventReasons(getSeries(ns, "db")) }).Should(ContainElement("NoRecentBackup"))

		By("counting from the newest version once there is one")
		node := getSeries(ns, "db").Status.Worker.Node
		waitToken(ns, node)
		push(ns, "db", node, randomTree(16))
		restore()
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionBackupOverdue)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring("since version 1"))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("having neither while suspended")
		updateSeries(ns, "db", func(s *backupv1alpha1.BackupSeriesSpec) { s.Suspend = true })
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.NextBackup).To(BeNil())
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionBackupOverdue).Status).To(BeEquivalentTo("Absent"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("refuses a time zone the CronJob cannot use and a schedule that never fires, and runs no CronJob", func() {
		ns := newNamespace("badtz")
		for _, c := range []struct{ name, schedule, zone, reason, msg string }{
			{"mars", "0 2 * * *", "Mars/Olympus_Mons", "UnknownTimeZone", `timeZone "Mars/Olympus_Mons" is not a known IANA time zone`},
			{"local", "0 2 * * *", "Local", "UnknownTimeZone", `timeZone "Local" is not a known IANA time zone`},
			{"never", "0 0 30 2 *", "", "InvalidSchedule", `schedule "0 0 30 2 *" never fires`},
		} {
			bs := pvcSeries(ns, c.name)
			bs.Spec.Schedule = c.schedule
			if c.zone != "" {
				bs.Spec.TimeZone = ptr.To(c.zone)
			}
			placedSeries(bs)
			Eventually(func(g Gomega) {
				st := getSeries(ns, c.name).Status
				cond := condition(st.Conditions, backupv1alpha1.ConditionScheduleValid)
				g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(cond.Reason).To(Equal(c.reason))
				g.Expect(cond.Message).To(Equal(c.msg))
				g.Expect(condition(st.Conditions, backupv1alpha1.ConditionReady).Reason).To(Equal(c.reason), "the status is still written")
			}).Should(Succeed())
			Expect(apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: c.name + "-backup"}, &batchv1.CronJob{}))).To(BeTrue())
		}
	})

	It("says when its RetentionPolicy does not exist", func() {
		ns := newNamespace("norp")
		bs := pvcSeries(ns, "db")
		bs.Spec.RetentionPolicyRef = &backupv1alpha1.LocalObjectReference{Name: "weekly"}
		placedSeries(bs)
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionRetentionPolicyFound)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(Equal("RetentionPolicy weekly not found in namespace " + ns + ": every version is kept"))
		}).Should(Succeed())
	})

	It("keeps namespaces apart on the worker", func() {
		a, b := newNamespace("team-a"), newNamespace("team-b")
		sa := placedSeries(pvcSeries(a, "db"))
		placedSeries(pvcSeries(b, "db"))
		push(a, "db", sa.Status.Worker.Node, randomTree(32))
		waitToken(b, sa.Status.Worker.Node)
		tokB, err := os.ReadFile(nsTokenFile(b))
		Expect(err).NotTo(HaveOccurred())
		_, err = workerclient.JSON(workerClient(sa.Status.Worker.Node, string(tokB)).GetSeriesWithResponse(ctx, a, "db"))
		var werr *workerclient.APIError
		Expect(err).To(BeAssignableToTypeOf(werr))
		Expect(err.(*workerclient.APIError).Status).To(Equal(403))
		Expect(workerclient.HasCode(err, workerclient.ErrorCodeForbidden)).To(BeTrue(), "%v", err)
		// Each namespace has its own token, and neither is the admin token.
		tokA, err := os.ReadFile(nsTokenFile(a))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(tokA)).NotTo(Equal(string(tokB)))
		Expect(string(tokA)).NotTo(Equal(adminToken()))
	})

	Context("when deleted", func() {
		It("deletes the series from the worker with deletionPolicy Delete", func() {
			ns := newNamespace("del")
			bs := pvcSeries(ns, "db")
			bs.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			bs = placedSeries(bs)
			node := bs.Status.Worker.Node
			push(ns, "db", node, randomTree(128))
			Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(1))
			_, err := adminClient(node).Series(ctx, ns, "db")
			Expect(err).NotTo(HaveOccurred())

			Expect(k8sClient.Delete(ctx, bs)).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{}))
			}).WithTimeout(20 * time.Second).Should(BeTrue())
			expectNoData(node, ns, "db")
		})

		It("leaves the series on the worker with deletionPolicy Retain", func() {
			ns := newNamespace("keep")
			bs := placedSeries(pvcSeries(ns, "db"))
			node := bs.Status.Worker.Node
			push(ns, "db", node, randomTree(128))
			Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(1))

			Expect(k8sClient.Delete(ctx, bs)).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{}))
			}).WithTimeout(20 * time.Second).Should(BeTrue())
			s, err := adminClient(node).Series(ctx, ns, "db")
			Expect(err).NotTo(HaveOccurred())
			Expect(s.VersionList).To(HaveLen(1))
		})

		It("keeps the finalizer while the worker refuses, and retries", func() {
			ns := newNamespace("stuck")
			bs := pvcSeries(ns, "db")
			bs.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			bs = placedSeries(bs)
			node := bs.Status.Worker.Node
			push(ns, "db", node, randomTree(64))
			// Point the series at a worker that is not there: the operator must not drop the data
			// silently.
			Eventually(func() error {
				cur := getSeries(ns, "db")
				cur.Status.Worker.Node = "node-gone"
				cur.Status.Worker.Endpoint = "http://127.0.0.1:1"
				return k8sClient.Status().Update(ctx, cur)
			}).Should(Succeed())
			Expect(k8sClient.Delete(ctx, bs)).To(Succeed())
			Eventually(func(g Gomega) {
				cur := getSeries(ns, "db")
				g.Expect(cur.Status.Phase).To(Equal(backupv1alpha1.SeriesDeleting))
				c := condition(cur.Status.Conditions, backupv1alpha1.ConditionSynced)
				g.Expect(c.Reason).To(Equal("DeleteFailed"))
				g.Expect(c.Message).To(ContainSubstring("deleting the series from the ssd worker on node node-gone"))
			}).WithTimeout(20 * time.Second).Should(Succeed())
			Consistently(func() error {
				return k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{})
			}).WithTimeout(3 * time.Second).Should(Succeed())
			// Back on its real worker, the deletion completes.
			Eventually(func() error {
				cur := getSeries(ns, "db")
				cur.Status.Worker.Node = node
				cur.Status.Worker.Endpoint = "http://revault-worker-ssd-" + node + ".revault-system.svc:8420"
				return k8sClient.Status().Update(ctx, cur)
			}).Should(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{}))
			}).WithTimeout(30 * time.Second).Should(BeTrue())
			expectNoData(node, ns, "db")
		})
	})
})
