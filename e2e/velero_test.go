package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// 10. Velero with the Revault plugin. Velero's server is built from its Go module and its image
// made locally (hack/velero-plugin.sh e2e-images), installed with its own CLI, and given the
// plugin with `velero plugin add`; its backup storage location is a bucket on a Revault worker.
// A namespace whose PVC holds generated files is backed up, deleted and restored (the files
// byte-exact, the workload started only once they are back), and deleting the Velero backup
// removes its version and objects from Revault and frees the worker's disk.
//
// Environment (hack/e2e.sh): E2E_VELERO (the velero binary: CLI and server), E2E_VELERO_IMAGE,
// E2E_VELERO_PLUGIN_IMAGE (both loaded into the nodes).

const (
	veleroNS = "velero"
	// Labels and annotations of the plugin (velero-plugin/internal/kube).
	veleroSelect       = "revault.io/velero"
	veleroRestoreLabel = "revault.io/velero-restore"
	veleroGate         = "revault.io/restore"
)

var (
	veleroBackupGVK   = schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "Backup"}
	veleroRestoreGVK  = schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "Restore"}
	veleroBSLGVK      = schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "BackupStorageLocation"}
	veleroDownloadGVK = schema.GroupVersionKind{Group: "velero.io", Version: "v1", Kind: "DownloadRequest"}
)

// velero runs the Velero CLI against the cluster (KUBECONFIG) and returns its output.
func velero(timeout time.Duration, args ...string) (string, error) {
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(c, mustEnv("E2E_VELERO"), args...)
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ velero %s\n%s", strings.Join(args, " "), out)
	return string(out), err
}

// veleroObject reads a Velero object (unstructured: the suite does not link Velero's types).
func veleroObject(gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u, k.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: name}, u)
}

func nestedString(u *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, path...)
	return s
}

func nestedInt(u *unstructured.Unstructured, path ...string) int64 {
	n, _, _ := unstructured.NestedInt64(u.Object, path...)
	return n
}

// bucketSummary is GET /v1/buckets/{ns}/{bucket}: content, uploaded (gzip) and stored bytes.
type bucketSummary struct {
	Objects, Size, UploadedBytes, StoredBytes int64
}

func bucketOf(endpoint, bucket string) bucketSummary {
	GinkgoHelper()
	calls := workerAPI(veleroNS, endpoint, "GET /v1/buckets/"+veleroNS+"/"+bucket)
	Expect(calls[0].Status).To(Equal(200), calls[0].Body)
	var b bucketSummary
	Expect(json.Unmarshal([]byte(calls[0].Body), &b)).To(Succeed(), calls[0].Body)
	return b
}

// veleroBackup runs `velero backup create NAME --include-namespaces NS --wait` and checks the
// backup completed with the one Revault operation (the PVC's backup) done.
func veleroBackup(name, ns string) {
	GinkgoHelper()
	out, err := velero(15*time.Minute, "backup", "create", name, "--include-namespaces", ns,
		"--snapshot-volumes=false", "--wait")
	Expect(err).NotTo(HaveOccurred(), out)
	expectVeleroCompleted(veleroBackupGVK, name, "backup")
}

// veleroRestore runs `velero restore create NAME --from-backup BACKUP --wait` and checks the
// restore completed with the one Revault operation (the PVC's restore) done.
func veleroRestore(name, backup string) {
	GinkgoHelper()
	out, err := velero(15*time.Minute, "restore", "create", name, "--from-backup", backup, "--wait")
	Expect(err).NotTo(HaveOccurred(), out)
	expectVeleroCompleted(veleroRestoreGVK, name, "restore")
}

// expectVeleroCompleted checks that the Velero Backup or Restore (op "backup" or "restore") name
// completed without errors, with exactly one item operation (the PVC's, by the Revault plugin)
// attempted and completed.
func expectVeleroCompleted(gvk schema.GroupVersionKind, name, op string) {
	GinkgoHelper()
	u, err := veleroObject(gvk, name)
	Expect(err).NotTo(HaveOccurred())
	Expect(nestedString(u, "status", "phase")).To(Equal("Completed"), "%s status: %v", op, u.Object["status"])
	Expect(nestedInt(u, "status", op+"ItemOperationsAttempted")).To(BeEquivalentTo(1), "the PVC's Revault "+op)
	Expect(nestedInt(u, "status", op+"ItemOperationsCompleted")).To(BeEquivalentTo(1))
	Expect(nestedInt(u, "status", "errors")).To(BeZero())
}

// pauseImage is the pod sandbox image every node has (kubelet needs it): a workload that only
// holds its volume.
func pauseImage() string {
	GinkgoHelper()
	var nodes corev1.NodeList
	Expect(k.List(ctx, &nodes)).To(Succeed())
	for _, n := range nodes.Items {
		for _, img := range n.Status.Images {
			for _, name := range img.Names {
				if strings.Contains(name, "/pause:") {
					return name
				}
			}
		}
	}
	Fail("no node lists a pause image")
	return ""
}

var _ = Describe("10. Velero with the Revault plugin", Ordered, func() {
	var (
		app, bucket, backupName, againName, restoreName string
		want                                            toolresult.Sum
		bsl                                             *backupv1alpha1.BackupSeries
		afterFirst                                      bucketSummary
	)
	const claim = "data"

	BeforeAll(func() {
		veleroImage, pluginImage := mustEnv("E2E_VELERO_IMAGE"), mustEnv("E2E_VELERO_PLUGIN_IMAGE")
		bucket, backupName, againName, restoreName = "bsl-"+runID, "app-"+runID, "app-again-"+runID, "app-"+runID

		By("velero install (server image " + veleroImage + ")")
		if err := k.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: "velero"}, &appsv1.Deployment{}); err == nil {
			// A kept cluster (KEEP=1) may hold an older Velero: start from scratch.
			out, err := velero(5*time.Minute, "uninstall", "--force")
			Expect(err).NotTo(HaveOccurred(), out)
		}
		out, err := velero(5*time.Minute, "install", "--image", veleroImage, "--no-default-backup-location",
			"--use-volume-snapshots=false", "--no-secret", "--wait")
		Expect(err).NotTo(HaveOccurred(), out)
		DeferCleanup(func() {
			if anyFailed.Load() || CurrentSpecReport().Failed() {
				GinkgoWriter.Println("keeping Velero installed (a spec failed)")
				return
			}
			out, err := velero(5*time.Minute, "uninstall", "--force")
			Expect(err).NotTo(HaveOccurred(), out)
		})

		By("velero plugin add " + pluginImage)
		out, err = velero(time.Minute, "plugin", "add", pluginImage, "--confirm")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func(g Gomega) {
			d := &appsv1.Deployment{}
			g.Expect(k.Get(ctx, client.ObjectKey{Namespace: veleroNS, Name: "velero"}, d)).To(Succeed())
			g.Expect(d.Spec.Template.Spec.InitContainers).To(ContainElement(
				HaveField("Image", pluginImage)), "the plugin's init container")
			g.Expect(d.Status.ObservedGeneration).To(Equal(d.Generation))
			g.Expect(d.Status.UpdatedReplicas).To(Equal(*d.Spec.Replicas))
			g.Expect(d.Status.AvailableReplicas).To(Equal(*d.Spec.Replicas))
			g.Expect(d.Status.Replicas).To(Equal(*d.Spec.Replicas), "the old pod is gone")
		}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())

		By("the bucket " + bucket + ": a BackupSeries with an external source in Velero's namespace")
		// The operator places it on a worker and gives the namespace its token (Secret
		// revault-token), where the plugin finds both.
		Expect(k.Create(ctx, &backupv1alpha1.BackupSeries{
			ObjectMeta: metav1.ObjectMeta{Name: bucket, Namespace: veleroNS},
			Spec: backupv1alpha1.BackupSeriesSpec{
				Source:  backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "velero"}},
				Storage: backupv1alpha1.StorageSpec{Media: backupv1alpha1.MediaSSD},
			},
		})).To(Succeed())
		bsl = waitSeriesReady(veleroNS, bucket)

		By("velero backup-location create default --provider revault.io/object-store --bucket " + bucket)
		out, err = velero(time.Minute, "backup-location", "create", "default", "--provider", "revault.io/object-store",
			"--bucket", bucket, "--default")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func(g Gomega) {
			u, err := veleroObject(veleroBSLGVK, "default")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(nestedString(u, "status", "phase")).To(Equal("Available"), "message: %s", nestedString(u, "status", "message"))
		}).WithTimeout(3 * time.Minute).WithPolling(poll).Should(Succeed())

		By("a namespace with a workload and a PVC of generated files, selected for Revault")
		app = newNamespace("velero-app")
		pvc := newPVC(app, claim)
		pvc.Labels = map[string]string{veleroSelect: "true"}
		Expect(k.Create(ctx, pvc)).To(Succeed())
		// A seed of its own: the worker deduplicates against every series it holds, and this
		// scenario measures what one backup stores.
		gen := genTree(app, claim, int(time.Now().UnixNano()%1_000_000_007), 40, 48<<20)
		want = sumTree(app, claim)
		GinkgoWriter.Printf("generated %d files, %s\n", gen.Files, mib(gen.Bytes))
		labels := map[string]string{"app": "holder"}
		Expect(k.Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: app},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(int32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						TerminationGracePeriodSeconds: ptr.To(int64(1)),
						AutomountServiceAccountToken:  ptr.To(false),
						Containers: []corev1.Container{{
							Name: "holder", Image: pauseImage(), ImagePullPolicy: corev1.PullNever,
							VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
						}},
						Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
							PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
					},
				},
			},
		})).To(Succeed())
		Eventually(func(g Gomega) {
			d := &appsv1.Deployment{}
			g.Expect(k.Get(ctx, client.ObjectKey{Namespace: app, Name: "holder"}, d)).To(Succeed())
			g.Expect(d.Status.AvailableReplicas).To(BeEquivalentTo(1))
		}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
	})

	It("backs the namespace up: the PVC's data into its Revault series, Velero's files into the bucket", func() {
		veleroBackup(backupName, app)

		By("the PVC's series holds version 1 with the volume's bytes")
		Eventually(func(g Gomega) {
			bs := &backupv1alpha1.BackupSeries{}
			g.Expect(k.Get(ctx, client.ObjectKey{Namespace: app, Name: claim}, bs)).To(Succeed())
			g.Expect(bs.Spec.Source.PVC).NotTo(BeNil())
			g.Expect(versionNumbers(bs)).To(Equal([]int64{1}))
			g.Expect(version(bs, 1).LogicalBytes).To(BeNumerically(">=", want.Bytes))
			var done *backupv1alpha1.BackupNowResult
			for i := range bs.Status.BackupNow {
				if strings.HasPrefix(bs.Status.BackupNow[i].Request, "velero-"+backupName+"-") {
					done = &bs.Status.BackupNow[i]
				}
			}
			g.Expect(done).NotTo(BeNil(), "status.backupNow: %+v", bs.Status.BackupNow)
			g.Expect(done.Phase).To(Equal(backupv1alpha1.BackupNowSucceeded))
			g.Expect(done.Version).To(BeEquivalentTo(1))
		}).WithTimeout(time.Minute).WithPolling(poll).Should(Succeed())

		By("Velero's files for the backup are objects of the bucket on the worker")
		prefix := "/v1/buckets/" + veleroNS + "/" + bucket
		key := func(name string) string { return url.QueryEscape("backups/" + backupName + "/" + name) }
		calls := workerAPI(veleroNS, bsl.Status.Worker.Endpoint,
			"GET "+prefix+"/object/meta?key="+key(backupName+".tar.gz"),
			"GET "+prefix+"/object/meta?key="+key("velero-backup.json"))
		for _, c := range calls {
			Expect(c.Status).To(Equal(200), "%s: %s", c.Request, c.Body)
		}
		var tarball struct {
			Size, UploadedBytes, TarMembers int64
			Encoding                        string
		}
		Expect(json.Unmarshal([]byte(calls[0].Body), &tarball)).To(Succeed(), calls[0].Body)
		Expect(tarball.Encoding).To(Equal("gzip"), "stored decompressed, served as gzip")
		Expect(tarball.TarMembers).To(BeNumerically(">", 5), "one member per backed-up resource")
		afterFirst = bucketOf(bsl.Status.Worker.Endpoint, bucket)
		Expect(afterFirst.Objects).To(BeNumerically(">=", 5))
		GinkgoWriter.Printf("FIGURES bucket %s after one backup: %d objects, %d bytes of content, %d uploaded, %d stored "+
			"(tarball: %d members, %d bytes, %d as gzip)\n", bucket, afterFirst.Objects, afterFirst.Size,
			afterFirst.UploadedBytes, afterFirst.StoredBytes, tarball.TarMembers, tarball.Size, tarball.UploadedBytes)

		By("Velero's download requests get a signed URL that reads the object without a token")
		dr := &unstructured.Unstructured{}
		dr.SetGroupVersionKind(veleroDownloadGVK)
		dr.SetNamespace(veleroNS)
		dr.SetName("log-" + runID)
		Expect(unstructured.SetNestedMap(dr.Object, map[string]any{"kind": "BackupLog", "name": backupName},
			"spec", "target")).To(Succeed())
		Expect(k.Create(ctx, dr)).To(Succeed())
		var signed string
		Eventually(func(g Gomega) {
			u, err := veleroObject(veleroDownloadGVK, dr.GetName())
			g.Expect(err).NotTo(HaveOccurred())
			signed = nestedString(u, "status", "downloadURL")
			g.Expect(signed).NotTo(BeEmpty(), "status: %v", u.Object["status"])
		}).WithTimeout(2 * time.Minute).WithPolling(poll).Should(Succeed())
		su, err := url.Parse(signed)
		Expect(err).NotTo(HaveOccurred())
		Expect(su.Path).To(HavePrefix("/v1/signed/"))
		tampered := su.Query()
		tampered.Set("key", "backups/"+backupName+"/velero-backup.json")
		calls = workerAPI(veleroNS, su.Scheme+"://"+su.Host,
			"GET "+su.RequestURI(), "GET "+su.Path+"?"+tampered.Encode())
		Expect(calls[0].Status).To(Equal(200), calls[0].Body)
		// The body comes back as JSON text, so only gzip's first magic byte survives as is.
		Expect(calls[0].Body).To(HavePrefix("\x1f"), "the log, gzip as Velero wrote it")
		Expect(calls[1].Status).To(Equal(403), "a URL signed for another key: %s", calls[1].Body)
	})

	It("backs the unchanged namespace up again: its volume and most of Velero's files deduplicate", func() {
		before := getSeries(app, claim)
		veleroBackup(againName, app)
		var bs *backupv1alpha1.BackupSeries
		Eventually(func(g Gomega) {
			bs = getSeries(app, claim)
			g.Expect(versionNumbers(bs)).To(Equal([]int64{1, 2}))
		}).WithTimeout(time.Minute).WithPolling(poll).Should(Succeed())
		v1, v2 := version(bs, 1), version(bs, 2)
		Expect(v2.LogicalBytes).To(Equal(v1.LogicalBytes))
		Expect(v2.NewBytes).To(BeNumerically("<", v1.NewBytes/100), "the unchanged volume stores almost nothing new")
		Expect(bs.Status.StoredBytes - before.Status.StoredBytes).To(BeNumerically("<", v1.StoredBytes/100))
		after := bucketOf(bsl.Status.Worker.Endpoint, bucket)
		uploaded, stored := after.UploadedBytes-afterFirst.UploadedBytes, after.StoredBytes-afterFirst.StoredBytes
		GinkgoWriter.Printf("FIGURES volume: version 1 %s logical, %s new, %s stored; version 2 %s new, %s stored\n",
			mib(v1.LogicalBytes), mib(v1.NewBytes), mib(v1.StoredBytes), mib(v2.NewBytes), mib(v2.StoredBytes))
		GinkgoWriter.Printf("FIGURES bucket: the second backup's %d objects uploaded %d bytes (gzip), stored %d\n",
			after.Objects-afterFirst.Objects, uploaded, stored)
		Expect(after.Objects).To(BeNumerically(">", afterFirst.Objects))
		Expect(stored).To(BeNumerically("<", uploaded), "the second backup's files store less than their gzip bytes")
	})

	It("restores the deleted namespace: the PVC byte-exact, its workload started once the data was back", func() {
		By("deleting namespace " + app)
		Expect(k.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app}})).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k.Get(ctx, client.ObjectKey{Name: app}, &corev1.Namespace{}))
		}).WithTimeout(podTimeout).WithPolling(poll).Should(BeTrue())

		By("velero restore create --from-backup " + backupName)
		veleroRestore(restoreName, backupName)

		By("a RestoreJob put version 1 back into the recreated PVC")
		var rjs backupv1alpha1.RestoreJobList
		Expect(k.List(ctx, &rjs, client.InNamespace(app), client.MatchingLabels{veleroRestoreLabel: restoreName})).To(Succeed())
		Expect(rjs.Items).To(HaveLen(1))
		rj := &rjs.Items[0]
		expectRestoreSucceeded(rj, 1)
		Expect(rj.Spec.TargetPVC.ClaimName).To(Equal(claim))

		By("the old PV was not restored: the claim got a fresh volume")
		var pvs corev1.PersistentVolumeList
		Expect(k.List(ctx, &pvs, client.MatchingLabels{"velero.io/restore-name": restoreName})).To(Succeed())
		Expect(pvs.Items).To(BeEmpty())

		By("the workload's pod starts only after the restore finished")
		var pod corev1.Pod
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k.List(ctx, &pods, client.InNamespace(app), client.MatchingLabels{"app": "holder"})).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(1))
			pod = pods.Items[0]
			g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning), podSummary(&pod))
		}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
		Expect(pod.Labels).To(HaveKeyWithValue("velero.io/restore-name", restoreName), "the pod Velero restored")
		Expect(pod.Spec.SchedulingGates).To(BeEmpty())
		Expect(pod.Status.StartTime).NotTo(BeNil())
		Expect(pod.Status.StartTime.Before(rj.Status.CompletionTime)).To(BeFalse(),
			"pod started %s, restore done %s", pod.Status.StartTime, rj.Status.CompletionTime)

		By("the PVC's files are byte-exact")
		expectSameTree(sumTree(app, claim), want, "after velero restore")
	})

	It("deletes the Velero backups: their versions and objects go, and the worker frees the data", func() {
		bs := getSeries(app, claim)
		w := bs.Status.Worker
		Expect(w).NotTo(BeNil())
		v1 := version(bs, 1)
		Expect(v1).NotTo(BeNil())
		path := "/v1/series/" + app + "/" + claim
		objects := func(backup string) string {
			return "GET /v1/buckets/" + veleroNS + "/" + bucket + "/objects?limit=3&prefix=" + url.QueryEscape("backups/"+backup+"/")
		}
		deleteBackup := func(name string) {
			GinkgoHelper()
			calls := workerAPI(veleroNS, bsl.Status.Worker.Endpoint, objects(name))
			Expect(calls[0].Status).To(Equal(200), calls[0].Body)
			Expect(calls[0].Body).To(ContainSubstring(`"key":"backups/` + name + `/`))
			out, err := velero(time.Minute, "backup", "delete", name, "--confirm")
			Expect(err).NotTo(HaveOccurred(), out)
			Eventually(func() bool {
				_, err := veleroObject(veleroBackupGVK, name)
				return apierrors.IsNotFound(err)
			}).WithTimeout(podTimeout).WithPolling(poll).Should(BeTrue(), "the Backup object goes once Velero deleted its data")
			calls = workerAPI(veleroNS, bsl.Status.Worker.Endpoint, objects(name))
			Expect(calls[0].Status).To(Equal(200), calls[0].Body)
			Expect(calls[0].Body).To(ContainSubstring(`"objects":[]`), "the bucket holds none of %s's objects", name)
		}

		By("velero backup delete " + backupName + ": version 1 goes; its data stays, version 2 uses it")
		before := storedBytes(string(w.Media), w.Node)
		deleteBackup(backupName)
		calls := workerAPI(app, w.Endpoint, "GET "+path, "GET "+path+"/versions/1", "GET "+path+"/versions/2")
		Expect(calls[0].Status).To(Equal(200), calls[0].Body)
		Expect(calls[0].Body).To(ContainSubstring(`"versions":1`))
		Expect(calls[1].Status).To(Equal(404), calls[1].Body)
		Expect(calls[1].Code).To(Equal("unknown_version"))
		Expect(calls[2].Status).To(Equal(200), calls[2].Body)
		middle := storedBytes(string(w.Media), w.Node)
		Expect(before-middle).To(BeNumerically("<", v1.StoredBytes/2), "version 2 still references the data")

		By("velero backup delete " + againName + ": version 2 goes, and with it the data")
		deleteBackup(againName)
		calls = workerAPI(app, w.Endpoint, "GET "+path, "GET "+path+"/versions/2")
		Expect(calls[0].Status).To(Equal(200), calls[0].Body)
		Expect(calls[0].Body).To(ContainSubstring(`"versions":0`))
		Expect(calls[1].Status).To(Equal(404), calls[1].Body)
		Eventually(func() int64 {
			return before - storedBytes(string(w.Media), w.Node)
		}).WithTimeout(time.Minute).WithPolling(poll).Should(BeNumerically(">=", v1.StoredBytes*9/10))
		GinkgoWriter.Printf("FIGURES worker %s stored %s before the deletions, %s after the first, %s after the second "+
			"(version 1 stored %s)\n", w.Node, mib(before), mib(middle), mib(storedBytes(string(w.Media), w.Node)), mib(v1.StoredBytes))
	})
})
