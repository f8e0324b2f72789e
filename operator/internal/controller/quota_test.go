package controller

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// setNamespaceQuota sets (or, with "", removes) the revault.io/quota annotation of ns.
func setNamespaceQuota(ns, quota string) {
	Eventually(func() error {
		cur := &corev1.Namespace{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: ns}, cur); err != nil {
			return err
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		if quota == "" {
			delete(cur.Annotations, backupv1alpha1.QuotaAnnotation)
		} else {
			cur.Annotations[backupv1alpha1.QuotaAnnotation] = quota
		}
		return k8sClient.Update(ctx, cur)
	}).Should(Succeed())
}

// waitQuotaCondition waits until ns's series db says QuotaExceeded with this status and reason,
// its message holding each of msgs.
func waitQuotaCondition(ns string, status metav1.ConditionStatus, reason string, msgs ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionQuotaExceeded)
		g.Expect(c.Status).To(Equal(status))
		g.Expect(c.Reason).To(Equal(reason))
		for _, m := range msgs {
			g.Expect(c.Message).To(ContainSubstring(m))
		}
	}).WithTimeout(20 * time.Second).Should(Succeed())
}

// waitQuotaLine waits until the workers' quota file holds line.
func waitQuotaLine(line string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		sec := &corev1.Secret{}
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerTokensSecret}, sec)).To(Succeed())
		g.Expect(string(sec.Data[plan.WorkerQuotasKey])).To(ContainSubstring(line))
	}).WithTimeout(20 * time.Second).Should(Succeed())
}

var _ = Describe("Namespace quotas", func() {
	BeforeEach(requireWorkers)

	It("suspends a namespace's backups while its series store its revault.io/quota, tells the workers, and resumes when the quota rises", func() {
		ns := newNamespace("quota")
		bs := pvcSeries(ns, "db")
		bs.Spec.Schedule = "0 2 * * *"
		bs = placedSeries(bs)
		w := bs.Status.Worker
		push(ns, "db", w.Node, randomTree(256))
		var stored int64
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.LogicalBytes).To(BeNumerically(">", 0))
			g.Expect(condition(st.Conditions, backupv1alpha1.ConditionQuotaExceeded).Status).To(BeEquivalentTo("Absent"),
				"no quota, no condition")
			stored = st.LogicalBytes
		}).WithTimeout(20 * time.Second).Should(Succeed())
		cronSuspended := func() bool {
			cj := &batchv1.CronJob{}
			if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "db-backup"}, cj); err != nil {
				return false
			}
			return cj.Spec.Suspend != nil && *cj.Spec.Suspend
		}
		Expect(cronSuspended()).To(BeFalse())

		By("a quota the namespace's series already store")
		setNamespaceQuota(ns, fmt.Sprint(stored))
		waitQuotaCondition(ns, metav1.ConditionTrue, "OverQuota", "namespace "+ns+" holds", "no new backup starts")
		Eventually(cronSuspended).Should(BeTrue())
		Expect(getSeries(ns, "db").Status.NextBackup).To(BeNil(), "a schedule suspended for the quota has no next backup")
		waitQuotaLine(fmt.Sprintf("%s %d\n", ns, stored))
		Expect(eventReasons(bs)).To(ContainElement("OverQuota"))

		By("a backup-now request fails at once, and no Job starts")
		annotate(bs, backupv1alpha1.BackupNowAnnotation, "over")
		Eventually(func(g Gomega) {
			st := getSeries(ns, "db").Status
			g.Expect(st.LastBackupNow).To(Equal("over"))
			g.Expect(st.BackupNow).NotTo(BeEmpty())
			last := st.BackupNow[len(st.BackupNow)-1]
			g.Expect(last.Phase).To(Equal(backupv1alpha1.BackupNowFailed))
			g.Expect(last.Message).To(ContainSubstring("over its quota"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(backupJobs(ns, "db")).To(BeEmpty())

		By("a quota that does not parse: no quota, and the series says why")
		setNamespaceQuota(ns, "lots")
		waitQuotaCondition(ns, metav1.ConditionUnknown, "InvalidQuota", `"lots" is not a quantity of bytes`)
		Eventually(cronSuspended).Should(BeFalse())

		By("a raised quota resumes the schedule")
		setNamespaceQuota(ns, "10Gi")
		waitQuotaCondition(ns, metav1.ConditionFalse, "WithinQuota", "of its quota 10Gi")
		Expect(cronSuspended()).To(BeFalse())
		waitQuotaLine(fmt.Sprintf("%s %d\n", ns, int64(10)<<30))

		By("no quota: no condition")
		setNamespaceQuota(ns, "")
		Eventually(func(g Gomega) {
			c := condition(getSeries(ns, "db").Status.Conditions, backupv1alpha1.ConditionQuotaExceeded)
			g.Expect(c.Status).To(BeEquivalentTo("Absent"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})
})
