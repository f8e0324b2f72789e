package controller

import (
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

func pvcSeries(ns, name string) *backupv1alpha1.BackupSeries {
	return &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: backupv1alpha1.BackupSeriesSpec{
			Source: backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: name + "-data"}},
		},
	}
}

// rejected creates obj with a server-side dry run and returns the API server's error text.
func rejected(obj client.Object) string {
	err := k8sClient.Create(ctx, obj, client.DryRunAll)
	Expect(err).To(HaveOccurred(), "the API server accepted %T %s", obj, obj.GetName())
	return err.Error()
}

// updateError applies mutate to the newest version of obj and returns the API server's error
// (retrying when the operator changed the object in between).
func updateError(obj client.Object, mutate func(client.Object)) string {
	var msg string
	Eventually(func() bool {
		cur := obj.DeepCopyObject().(client.Object)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), cur)).To(Succeed())
		mutate(cur)
		err := k8sClient.Update(ctx, cur)
		Expect(err).To(HaveOccurred(), "the API server accepted the change")
		msg = err.Error()
		return !apierrors.IsConflict(err)
	}).Should(BeTrue())
	return msg
}

var _ = Describe("CRD validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace("valid") })

	It("accepts a minimal BackupSeries and fills in the defaults", func() {
		bs := pvcSeries(ns, "db")
		Expect(k8sClient.Create(ctx, bs, client.DryRunAll)).To(Succeed())
		Expect(bs.Spec.Storage.Media).To(Equal(backupv1alpha1.MediaSSD))
		Expect(bs.Spec.Dedup.Unit).To(Equal(backupv1alpha1.DedupSegment))
		Expect(bs.Spec.DeletionPolicy).To(Equal(backupv1alpha1.DeletionRetain))
	})

	DescribeTable("rejects a bad BackupSeries with a clear message",
		func(mutate func(*backupv1alpha1.BackupSeries), want string) {
			bs := pvcSeries(ns, "db")
			mutate(bs)
			Expect(rejected(bs)).To(ContainSubstring(want))
		},
		Entry("two sources", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Source.External = &backupv1alpha1.ExternalSource{}
		}, "exactly one of source.pvc or source.external must be set"),
		Entry("no source", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Source.PVC = nil
		}, "exactly one of source.pvc or source.external must be set"),
		Entry("a schedule that is not cron", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Schedule = "every night"
		}, `schedule must be a cron schedule of five fields (e.g. "0 2 * * *")`),
		Entry("a time zone without a schedule", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.TimeZone = ptr.To("Europe/Berlin")
		}, "timeZone applies to a schedule: set schedule too"),
		Entry("a time zone that is no zone name", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Schedule, bs.Spec.TimeZone = "0 2 * * *", ptr.To("UTC+2 (summer)")
		}, "spec.timeZone in body should match"),
		Entry("a cron schedule with six fields", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Schedule = "0 0 2 * * *"
		}, "schedule must be a cron schedule"),
		Entry("a time zone in the schedule", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Schedule = "TZ=UTC 0 2 * * *"
		}, "schedule must be a cron schedule"),
		Entry("a schedule on an external series", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Source = backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "velero"}}
			bs.Spec.Schedule = "@daily"
		}, "schedule applies to pvc sources only"),
		Entry("unknown media", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Storage.Media = "nvme"
		}, `spec.storage.media: Unsupported value: "nvme"`),
		Entry("unknown dedup unit", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Dedup.Unit = "file"
		}, `spec.dedup.unit: Unsupported value: "file"`),
		Entry("unknown deletion policy", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.DeletionPolicy = "Archive"
		}, `spec.deletionPolicy: Unsupported value: "Archive"`),
		Entry("a claim name that is not a Kubernetes name", func(bs *backupv1alpha1.BackupSeries) {
			bs.Spec.Source.PVC.ClaimName = "Data_Volume"
		}, "spec.source.pvc.claimName: Invalid value"),
	)

	It("accepts every cron shape the CronJob controller accepts", func() {
		for i, s := range []string{"0 2 * * *", "*/15 * * * *", "0 3 * * MON-FRI", "0 0 1 jan,jul *", "@daily", "@hourly", "@weekly"} {
			bs := pvcSeries(ns, "ok"+string(rune('a'+i)))
			bs.Spec.Schedule = s
			Expect(k8sClient.Create(ctx, bs, client.DryRunAll)).To(Succeed(), s)
		}
	})

	It("keeps the dedup unit and the media fixed after creation", func() {
		bs := pvcSeries(ns, "fixed")
		bs.Spec.Dedup.Unit = backupv1alpha1.DedupChunk
		Expect(k8sClient.Create(ctx, bs)).To(Succeed())

		Expect(updateError(bs, func(o client.Object) {
			o.(*backupv1alpha1.BackupSeries).Spec.Dedup.Unit = backupv1alpha1.DedupSegment
		})).To(ContainSubstring("dedup.unit is fixed when the series is created"))
		Expect(updateError(bs, func(o client.Object) {
			o.(*backupv1alpha1.BackupSeries).Spec.Storage.Media = backupv1alpha1.MediaHDD
		})).To(ContainSubstring("storage.media cannot change: the series' data lives on its worker"))

		// Other fields stay editable.
		Eventually(func() error {
			cur := &backupv1alpha1.BackupSeries{}
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), cur); err != nil {
				return err
			}
			cur.Spec.Schedule = "@daily"
			cur.Spec.DeletionPolicy = backupv1alpha1.DeletionDelete
			return k8sClient.Update(ctx, cur)
		}).Should(Succeed())
	})

	DescribeTable("rejects a bad RetentionPolicy with a clear message",
		func(spec backupv1alpha1.RetentionPolicySpec, want string) {
			rp := &backupv1alpha1.RetentionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "rp", Namespace: ns}, Spec: spec}
			Expect(rejected(rp)).To(ContainSubstring(want))
		},
		Entry("no keep rule", backupv1alpha1.RetentionPolicySpec{LiveVersions: ptr.To(int32(2))},
			"set at least one of keepVersions, keepWithin, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly"),
		Entry("keepDaily zero", backupv1alpha1.RetentionPolicySpec{KeepDaily: ptr.To(int32(0))},
			"spec.keepDaily in body should be greater than or equal to 1"),
		Entry("a time zone without calendar rules", backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(3)), TimeZone: ptr.To("Europe/Berlin")},
			"timeZone only applies to keepHourly, keepDaily, keepWeekly, keepMonthly and keepYearly"),
		Entry("a time zone that is no IANA name", backupv1alpha1.RetentionPolicySpec{KeepDaily: ptr.To(int32(7)), TimeZone: ptr.To("UTC+2 or so")},
			"spec.timeZone in body should match"),
		Entry("live window larger than keep", backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(3)), LiveVersions: ptr.To(int32(5))},
			"liveVersions must not exceed keepVersions"),
		Entry("keep zero", backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(0))},
			"spec.keepVersions: Invalid value: 0: spec.keepVersions in body should be greater than or equal to 1"),
		Entry("live zero", backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(3)), LiveVersions: ptr.To(int32(0))},
			"spec.liveVersions in body should be greater than or equal to 1"),
		Entry("a bad expiry schedule", backupv1alpha1.RetentionPolicySpec{KeepVersions: ptr.To(int32(3)), ExpirySchedule: "daily"},
			"expirySchedule must be a cron schedule"),
	)

	It("rejects a keepWithin that is not a Go duration", func() {
		u := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(`
apiVersion: backup.revault.io/v1alpha1
kind: RetentionPolicy
metadata: {name: days}
spec: {keepWithin: 30d}
`), &u.Object)).To(Succeed())
		u.SetNamespace(ns)
		Expect(rejected(u)).To(ContainSubstring(`keepWithin must be a duration such as "720h"`))
	})

	It("accepts a calendar policy (restic's keep-daily/weekly/monthly/yearly) in a time zone", func() {
		rp := &backupv1alpha1.RetentionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gfs", Namespace: ns},
			Spec: backupv1alpha1.RetentionPolicySpec{KeepDaily: ptr.To(int32(7)), KeepWeekly: ptr.To(int32(4)),
				KeepMonthly: ptr.To(int32(12)), KeepYearly: ptr.To(int32(3)), TimeZone: ptr.To("America/Argentina/Buenos_Aires")}}
		Expect(k8sClient.Create(ctx, rp, client.DryRunAll)).To(Succeed())
		wr := Rules(rp.Spec)
		Expect(wr.KeepDaily).To(HaveValue(BeEquivalentTo(7)))
		Expect(wr.KeepWeekly).To(HaveValue(BeEquivalentTo(4)))
		Expect(wr.KeepMonthly).To(HaveValue(BeEquivalentTo(12)))
		Expect(wr.KeepYearly).To(HaveValue(BeEquivalentTo(3)))
		Expect(wr.KeepHourly).To(BeNil())
		Expect(wr.Timezone).To(HaveValue(Equal("America/Argentina/Buenos_Aires")))
	})

	It("accepts a RetentionPolicy and defaults the live window to 1", func() {
		rp := &backupv1alpha1.RetentionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "rp", Namespace: ns},
			Spec: backupv1alpha1.RetentionPolicySpec{KeepWithin: &metav1.Duration{Duration: 720 * 3600e9}}}
		Expect(k8sClient.Create(ctx, rp, client.DryRunAll)).To(Succeed())
		Expect(rp.Spec.LiveVersions).To(HaveValue(BeEquivalentTo(1)))
	})

	restore := func(mutate func(*backupv1alpha1.RestoreJob)) *backupv1alpha1.RestoreJob {
		rj := &backupv1alpha1.RestoreJob{
			ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: ns},
			Spec: backupv1alpha1.RestoreJobSpec{
				SeriesRef: backupv1alpha1.LocalObjectReference{Name: "db"},
				TargetPVC: backupv1alpha1.PVCTarget{ClaimName: "db-restored"},
			},
		}
		mutate(rj)
		return rj
	}

	It("accepts a RestoreJob and fills in latest, opt and 64Mi", func() {
		rj := restore(func(*backupv1alpha1.RestoreJob) {})
		Expect(k8sClient.Create(ctx, rj, client.DryRunAll)).To(Succeed())
		Expect(rj.Spec.Version).To(Equal("latest"))
		Expect(rj.Spec.Cache.Policy).To(BeEquivalentTo("auto"))
		Expect(rj.Spec.Cache.MemoryBudget.String()).To(Equal("64Mi"))
		for _, v := range []string{"12", "2025-06-01T00:00:00Z", "2025-06-01T02:00:00.5+02:00"} {
			rj := restore(func(r *backupv1alpha1.RestoreJob) { r.Spec.Version = v })
			Expect(k8sClient.Create(ctx, rj, client.DryRunAll)).To(Succeed(), v)
		}
	})

	DescribeTable("rejects a bad RestoreJob with a clear message",
		func(mutate func(*backupv1alpha1.RestoreJob), want string) {
			Expect(rejected(restore(mutate))).To(ContainSubstring(want))
		},
		Entry("a version that is a word", func(r *backupv1alpha1.RestoreJob) { r.Spec.Version = "yesterday" },
			`version must be a version number, "latest", or an RFC 3339 time`),
		Entry("version zero", func(r *backupv1alpha1.RestoreJob) { r.Spec.Version = "0" },
			"version must be a version number"),
		Entry("a date without a time", func(r *backupv1alpha1.RestoreJob) { r.Spec.Version = "2025-06-01" },
			"version must be a version number"),
		Entry("too much cache", func(r *backupv1alpha1.RestoreJob) {
			q := resource.MustParse("32Gi")
			r.Spec.Cache.MemoryBudget = &q
		}, "cache.memoryBudget must be between 1Mi and 16Gi"),
		Entry("too little cache", func(r *backupv1alpha1.RestoreJob) {
			q := resource.MustParse("100Ki")
			r.Spec.Cache.MemoryBudget = &q
		}, "cache.memoryBudget must be between 1Mi and 16Gi"),
		Entry("unknown cache policy", func(r *backupv1alpha1.RestoreJob) { r.Spec.Cache.Policy = "arc" },
			`spec.cache.policy: Unsupported value: "arc"`),
		Entry("no target", func(r *backupv1alpha1.RestoreJob) { r.Spec.TargetPVC.ClaimName = "" },
			"spec.targetPVC.claimName"),
	)

	It("keeps a RestoreJob's spec fixed", func() {
		rj := restore(func(r *backupv1alpha1.RestoreJob) { r.Name = "fixed"; r.Spec.SeriesRef.Name = "missing" })
		Expect(k8sClient.Create(ctx, rj)).To(Succeed())
		Expect(updateError(rj, func(o client.Object) {
			o.(*backupv1alpha1.RestoreJob).Spec.Version = "3"
		})).To(ContainSubstring("a RestoreJob's spec cannot change; create a new RestoreJob"))
	})

	It("accepts every sample in config/samples", func() {
		files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "backup_v1alpha1_*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).NotTo(BeEmpty())
		for _, f := range files {
			b, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			for _, doc := range strings.Split(string(b), "\n---\n") {
				if strings.TrimSpace(doc) == "" {
					continue
				}
				u := &unstructured.Unstructured{}
				Expect(yaml.Unmarshal([]byte(doc), &u.Object)).To(Succeed(), f)
				u.SetNamespace(ns)
				Expect(k8sClient.Create(ctx, u, client.DryRunAll)).To(Succeed(), "%s: %s", f, u.GetName())
			}
		}
	})
})
