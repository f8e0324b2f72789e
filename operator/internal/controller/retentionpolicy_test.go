package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

func getPolicy(ns, name string) *backupv1alpha1.RetentionPolicy {
	rp := &backupv1alpha1.RetentionPolicy{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, rp)).To(Succeed())
	return rp
}

func updatePolicy(ns, name string, mutate func(*backupv1alpha1.RetentionPolicySpec)) {
	Eventually(func() error {
		rp := getPolicy(ns, name)
		mutate(&rp.Spec)
		return k8sClient.Update(ctx, rp)
	}).Should(Succeed())
}

// seriesUsing creates the series ns/db with retentionPolicyRef policy, waits for its placement,
// and returns the node of its worker.
func seriesUsing(ns, policy string) string {
	bs := pvcSeries(ns, "db")
	bs.Spec.RetentionPolicyRef = &backupv1alpha1.LocalObjectReference{Name: policy}
	return placedSeries(bs).Status.Worker.Node
}

var _ = Describe("RetentionPolicy", func() {
	BeforeEach(requireWorkers)

	It("pushes its rules to the worker of every series using it, expires, and reports what it reclaimed", func() {
		ns := newNamespace("rtp")
		node := seriesUsing(ns, "short")
		for i := 0; i < 3; i++ {
			push(ns, "db", node, randomTree(256))
		}
		Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(3))
		storedBefore := getSeries(ns, "db").Status.StoredBytes

		By("keeping the newest version only")
		rp := &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "short", Namespace: ns},
			Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(1))},
		}
		Expect(k8sClient.Create(ctx, rp)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := getPolicy(ns, "short")
			st := cur.Status
			g.Expect(st.ObservedGeneration).To(Equal(cur.Generation))
			g.Expect(st.SeriesCount).To(BeEquivalentTo(1))
			g.Expect(st.Series).To(HaveLen(1))
			g.Expect(st.Series[0].AppliedGeneration).To(Equal(cur.Generation))
			g.Expect(st.Series[0].LastExpired).To(Equal([]int64{1, 2}))
			g.Expect(st.Series[0].PendingExpiry).To(BeEmpty())
			g.Expect(st.BytesReclaimed).To(BeNumerically(">", 0))
			g.Expect(st.LastExpiryTime).NotTo(BeNil())
			g.Expect(st.LastSlideTime).NotTo(BeNil())
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionApplied).Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		s, err := adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.Keep).To(HaveValue(BeEquivalentTo(1)))
		Expect(s.Retention.Live).To(BeEquivalentTo(1))
		Expect(s.Retention.Auto).To(BeTrue(), "without an expiry schedule the worker applies the policy after each backup")
		Expect(s.VersionList).To(HaveLen(1))
		Expect(s.VersionList[0].Number).To(BeEquivalentTo(3))
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.VersionCount).To(BeEquivalentTo(1))
			g.Expect(st.Versions[0].Number).To(BeEquivalentTo(3))
			g.Expect(st.StoredBytes).To(BeNumerically("<", storedBefore))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []string { return eventReasons(rp) }).Should(ContainElements("RetentionStored", "Expired"))

		By("showing what the next expiry removes")
		updatePolicy(ns, "short", func(s *backupv1alpha1.RetentionPolicySpec) {
			s.KeepVersions = ptr.To(int32(2))
			s.ExpirySchedule = "0 3 * * *"
		})
		Eventually(func(g Gomega) {
			cur := getPolicy(ns, "short")
			g.Expect(cur.Status.Series[0].AppliedGeneration).To(Equal(cur.Generation))
			g.Expect(cur.Status.NextExpiryTime).NotTo(BeNil())
			g.Expect(condition(cur.Status.Conditions, backupv1alpha1.ConditionScheduled).Reason).To(Equal("Scheduled"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		s, err = adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.Keep).To(HaveValue(BeEquivalentTo(2)))
		Expect(s.Retention.Auto).To(BeFalse(), "with an expiry schedule the operator applies the policy")
		push(ns, "db", node, randomTree(64))
		push(ns, "db", node, randomTree(64))
		// The worker plans what its retention removes; the policy's status shows that plan.
		s, err = adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.PendingExpiry).To(Equal([]int64{3}))
		Eventually(func(g Gomega) {
			g.Expect(getPolicy(ns, "short").Status.Series[0].PendingExpiry).To(Equal([]int64{3}))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("expiring on the schedule")
		next := getPolicy(ns, "short").Status.NextExpiryTime.Time
		jump := time.Until(next) + time.Minute
		clock.Advance(jump)
		defer clock.Advance(-jump)
		Eventually(func(g Gomega) {
			st := getPolicy(ns, "short").Status
			g.Expect(st.Series[0].LastExpired).To(Equal([]int64{3}))
			g.Expect(st.Series[0].PendingExpiry).To(BeEmpty())
			g.Expect(st.LastExpiryTime.Time).To(BeTemporally(">=", next))
			g.Expect(st.NextExpiryTime.Time).To(BeTemporally(">", next))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() int32 { return getSeries(ns, "db").Status.VersionCount }).Should(BeEquivalentTo(2))

		By("clearing the rules on the worker when the series stops using the policy")
		updateSeries(ns, "db", func(s *backupv1alpha1.BackupSeriesSpec) { s.RetentionPolicyRef = nil })
		Eventually(func(g Gomega) {
			s, err := adminClient(node).Series(ctx, ns, "db")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.Retention.Keep == nil && s.Retention.KeepWithinSeconds == nil).To(BeTrue())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []backupv1alpha1.SeriesRetentionStatus { return getPolicy(ns, "short").Status.Series }).Should(BeEmpty())
	})

	It("stops expiring when the policy is deleted, and restores its rules when they drift", func() {
		ns := newNamespace("rtd")
		node := seriesUsing(ns, "one")
		rp := &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: ns},
			Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(1))},
		}
		Expect(k8sClient.Create(ctx, rp)).To(Succeed())
		keep := func(g Gomega) *int64 {
			s, err := adminClient(node).Series(ctx, ns, "db")
			g.Expect(err).NotTo(HaveOccurred())
			return s.Retention.Keep
		}
		push(ns, "db", node, randomTree(64))
		Eventually(keep).WithTimeout(20 * time.Second).Should(HaveValue(BeEquivalentTo(1)))

		By("repairing rules changed on the worker behind the policy's back")
		live, auto := int64(1), true
		Expect(adminClient(node).PutRetention(ctx, ns, "db", workerclient.Retention{Live: &live, Auto: &auto})).To(Succeed())
		Eventually(keep).WithTimeout(20 * time.Second).Should(HaveValue(BeEquivalentTo(1)))

		By("keeping every version once the policy is gone, as the series says (even while another finalizer holds it)")
		Eventually(func() error {
			cur := getPolicy(ns, "one")
			cur.Finalizers = append(cur.Finalizers, "example.com/hold")
			return k8sClient.Update(ctx, cur)
		}).Should(Succeed())
		Expect(k8sClient.Delete(ctx, rp)).To(Succeed())
		defer func() {
			Eventually(func() error {
				cur := &backupv1alpha1.RetentionPolicy{}
				if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "one"}, cur); err != nil {
					return client.IgnoreNotFound(err)
				}
				if cur.DeletionTimestamp.IsZero() {
					return nil // the policy that came back
				}
				cur.Finalizers = nil
				return k8sClient.Update(ctx, cur)
			}).Should(Succeed())
		}()
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionRetentionPolicyFound)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal("NotFound"))
			g.Expect(keep(g)).To(BeNil())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() []string { return eventReasons(getSeries(ns, "db")) }).Should(ContainElement("RetentionCleared"))
		push(ns, "db", node, randomTree(64))
		push(ns, "db", node, randomTree(64))
		s, err := adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.VersionList).To(HaveLen(3), "the worker expired versions by the deleted policy's rules")

		Eventually(func() error {
			cur := getPolicy(ns, "one")
			cur.Finalizers = nil
			return k8sClient.Update(ctx, cur)
		}).Should(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "one"}, &backupv1alpha1.RetentionPolicy{}))
		}).Should(BeTrue())

		By("applying the rules again when the policy comes back")
		rp = &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: ns},
			Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(2))},
		}
		Expect(k8sClient.Create(ctx, rp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(keep(g)).To(HaveValue(BeEquivalentTo(2)))
			s, err := adminClient(node).Series(ctx, ns, "db")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.VersionList).To(HaveLen(2))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("neither pushes nor expires for a series that dropped the policy after the policy listed it", func() {
		// The race window played deterministically: the policy's reconcile holds the series as its
		// (cached) list showed it, still naming the policy; the series has dropped it since.
		ns := newNamespace("rtstale")
		node := seriesUsing(ns, "p")
		for i := 0; i < 3; i++ {
			push(ns, "db", node, randomTree(32))
		}
		stale := getSeries(ns, "db")
		updateSeries(ns, "db", func(s *backupv1alpha1.BackupSeriesSpec) { s.RetentionPolicyRef = nil })
		rp := &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Generation: 1},
			Spec:       backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(1))},
		}
		r := &RetentionPolicyReconciler{Client: k8sClient, Reader: k8sClient, Recorder: record.NewFakeRecorder(10),
			Workers: &Workers{Client: k8sClient, Config: opConfig, Overrides: workerURL,
				Tokens: &tokens.Manager{Client: k8sClient, Reader: k8sClient, Namespace: operatorNS}}}
		var e backupv1alpha1.SeriesRetentionStatus
		ran, err := r.applyToSeries(ctx, rp, stale, &e, Rules(rp.Spec), true)
		Expect(err).NotTo(HaveOccurred())
		Expect(ran).To(BeFalse())
		s, err := adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.Keep).To(BeNil(), "the dropped policy's rules were pushed")
		Expect(s.VersionList).To(HaveLen(3), "versions were expired by a policy the series no longer uses")
	})

	It("waits for series that are not placed yet", func() {
		ns := newNamespace("rtpwait")
		bs := pvcSeries(ns, "db")
		bs.Spec.Storage.Media = backupv1alpha1.MediaHDD
		bs.Spec.RetentionPolicyRef = &backupv1alpha1.LocalObjectReference{Name: "p"}
		pod := workerPod("node-hdd-1", backupv1alpha1.MediaHDD)
		setPodReady(pod, false)
		defer setPodReady(pod, true)
		Expect(k8sClient.Create(ctx, bs)).To(Succeed())
		rp := &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
			Spec: backupv1alpha1.RetentionPolicySpec{KeepWithin: &metav1.Duration{Duration: 48 * time.Hour},
				LiveVersions: ptr.To(int32(2))},
		}
		Expect(k8sClient.Create(ctx, rp)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(getPolicy(ns, "p").Status.Conditions, backupv1alpha1.ConditionApplied)
			g.Expect(c.Reason).To(Equal("WaitingForPlacement"))
			g.Expect(c.Message).To(Equal("not placed yet: db"))
		}).Should(Succeed())
		setPodReady(pod, true)
		Eventually(func(g Gomega) {
			g.Expect(condition(getPolicy(ns, "p").Status.Conditions, backupv1alpha1.ConditionApplied).Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		s, err := adminClient("node-hdd-1").Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.KeepWithinSeconds).To(HaveValue(BeEquivalentTo(48 * 3600)))
		Expect(s.Retention.Live).To(BeEquivalentTo(2))
	})

	It("pushes calendar rules in a time zone, and reports a zone the worker does not know", func() {
		ns := newNamespace("rtpgfs")
		node := seriesUsing(ns, "gfs")
		rp := &backupv1alpha1.RetentionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "gfs", Namespace: ns},
			Spec: backupv1alpha1.RetentionPolicySpec{KeepDaily: ptr.To(int32(7)), KeepWeekly: ptr.To(int32(4)),
				KeepMonthly: ptr.To(int32(12)), TimeZone: ptr.To("Europe/Berlin")},
		}
		Expect(k8sClient.Create(ctx, rp)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(getPolicy(ns, "gfs").Status.Conditions, backupv1alpha1.ConditionApplied).Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		s, err := adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.KeepDaily).To(HaveValue(BeEquivalentTo(7)))
		Expect(s.Retention.KeepWeekly).To(HaveValue(BeEquivalentTo(4)))
		Expect(s.Retention.KeepMonthly).To(HaveValue(BeEquivalentTo(12)))
		Expect(s.Retention.KeepHourly).To(BeNil())
		Expect(s.Retention.Timezone).To(HaveValue(Equal("Europe/Berlin")))
		Expect(sameRules(s.Retention, Rules(rp.Spec))).To(BeTrue(), "what the worker stored reads back as the policy's rules: no push on every sync")

		By("a zone name of the right shape that is no zone")
		updatePolicy(ns, "gfs", func(s *backupv1alpha1.RetentionPolicySpec) { s.TimeZone = ptr.To("Mars/Olympus_Mons") })
		Eventually(func(g Gomega) {
			c := condition(getPolicy(ns, "gfs").Status.Conditions, backupv1alpha1.ConditionApplied)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring("Mars/Olympus_Mons"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		s, err = adminClient(node).Series(ctx, ns, "db")
		Expect(err).NotTo(HaveOccurred())
		Expect(s.Retention.Timezone).To(HaveValue(Equal("Europe/Berlin")), "the worker kept the rules it could apply")
	})
})

// workerPod returns the fake worker pod of a node.
func workerPod(node string, media backupv1alpha1.Media) *corev1.Pod {
	pod := &corev1.Pod{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: workerPodName(node, media)}, pod)).To(Succeed())
	return pod
}
