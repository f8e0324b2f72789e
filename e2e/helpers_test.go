package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/e2e/internal/toolresult"
	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// Bounds on waiting; none of them is an assertion about speed.
const (
	podTimeout    = 5 * time.Minute
	backupTimeout = 8 * time.Minute
	poll          = 2 * time.Second
)

// ---- namespaces, volumes -------------------------------------------------------------------

// newNamespace creates a test namespace (prefix-runID) and deletes it when the container is
// done, unless a spec of the run failed (hack/e2e.sh then prints its events).
func newNamespace(prefix string) string {
	name := prefix + "-" + runID
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{e2eLabel: runID}}}
	Expect(k.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func() {
		// Cleanup runs before ReportAfterEach: look at the current spec too.
		if CurrentSpecReport().Failed() {
			anyFailed.Store(true)
		}
		if anyFailed.Load() {
			GinkgoWriter.Printf("keeping namespace %s (a spec failed)\n", name)
			return
		}
		Expect(client.IgnoreNotFound(k.Delete(ctx, ns))).To(Succeed())
	})
	return name
}

// createPVC makes a 1Gi claim on the static local volumes kind-up.sh provides (bound when its
// first pod is scheduled).
func createPVC(ns, name string) {
	Expect(k.Create(ctx, newPVC(ns, name))).To(Succeed())
}

// newPVC is the claim createPVC makes.
func newPVC(ns, name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("revault-local"),
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			},
		},
	}
}

// ---- pods ----------------------------------------------------------------------------------

// runPod creates a pod that runs to completion and returns its log and final phase.
func runPod(pod *corev1.Pod) (string, corev1.PodPhase) {
	GinkgoHelper()
	startPod(pod)
	return waitPod(pod)
}

// startPod creates a pod that runs once.
func startPod(pod *corev1.Pod) {
	GinkgoHelper()
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.TerminationGracePeriodSeconds = ptr.To(int64(1))
	pod.Spec.AutomountServiceAccountToken = ptr.To(false)
	Expect(k.Create(ctx, pod)).To(Succeed())
}

// waitPod waits for a pod startPod made to end, and returns its log and phase (and deletes it).
func waitPod(pod *corev1.Pod) (string, corev1.PodPhase) {
	GinkgoHelper()
	var phase corev1.PodPhase
	Eventually(func(g Gomega) {
		p := &corev1.Pod{}
		g.Expect(k.Get(ctx, client.ObjectKeyFromObject(pod), p)).To(Succeed())
		phase = p.Status.Phase
		g.Expect(phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed), "pod %s/%s: %s", pod.Namespace, pod.Name, podSummary(p))
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
	logs, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(k.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
	return string(logs), phase
}

func podSummary(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			s += fmt.Sprintf(" %s: %s %s", c.Name, w.Reason, w.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(" %s: %s", c.Type, c.Message)
		}
	}
	return s
}

// toolPod is a pod running e2e-tool as root (to read and write every file of the volumes and
// set owners), with the PVC claim mounted at /data.
func toolPod(ns, name, claim string, args ...string) *corev1.Pod {
	return rootPod(ns, name, claim, toolImage, "/e2e-tool", args...)
}

// rootPod runs command from image as root with the PVC claim (if any) at /data.
func rootPod(ns, name, claim, image, command string, args ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullNever,
				Command: []string{command}, Args: args,
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(0)), RunAsGroup: ptr.To(int64(0))},
			}},
		},
	}
	if claim != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: "data", MountPath: "/data"})
	}
	return pod
}

// withToken mounts the namespace's worker token (Secret revault-token, made by the operator)
// at /etc/revault/token and the CA bundle of the workers' certificate (ConfigMap revault-ca) at
// /etc/revault/ca.crt, as the operator's Job pods have them.
func withToken(pod *corev1.Pod) *corev1.Pod {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To(int32(0o400)), Sources: []corev1.VolumeProjection{
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "revault-token"}}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "revault-ca"}}},
		}}}})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "token", MountPath: "/etc/revault", ReadOnly: true})
	return pod
}

// workerAPI calls a worker's API from a pod in ns with that namespace's token (e2e-tool api)
// and returns one answer per request.
func workerAPI(ns, endpoint string, reqs ...string) []toolresult.APICall {
	GinkgoHelper()
	args := []string{"api", "-server", endpoint}
	for _, r := range reqs {
		args = append(args, "-req", r)
	}
	var calls []toolresult.APICall
	tool(withToken(toolPod(ns, podName("api"), "", args...)), &calls)
	Expect(calls).To(HaveLen(len(reqs)))
	return calls
}

// tool runs e2e-tool in a pod and decodes its RESULT line into out.
func tool(pod *corev1.Pod, out any) {
	GinkgoHelper()
	logs, phase := runPod(pod)
	toolResult(pod, logs, phase, out)
}

// toolResult decodes the RESULT line of an e2e-tool pod that ended.
func toolResult(pod *corev1.Pod, logs string, phase corev1.PodPhase, out any) {
	GinkgoHelper()
	Expect(phase).To(Equal(corev1.PodSucceeded), "e2e-tool %v failed:\n%s", pod.Spec.Containers[0].Args, logs)
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), toolresult.Prefix); ok {
			Expect(json.Unmarshal([]byte(rest), out)).To(Succeed())
			return
		}
	}
	Fail("no RESULT line in the log of e2e-tool:\n" + logs)
}

// podSeq numbers the helper pods (specs run one at a time).
var podSeq int

func podName(what string) string { podSeq++; return fmt.Sprintf("%s-%d", what, podSeq) }

// runSeed is the e2e-tool seed for contents number n of this run. Workers deduplicate against
// everything they hold, so contents an earlier run left on a kept cluster (KEEP=1) would not be
// stored again and the stored-bytes checks would fail: every run gets contents of its own.
func runSeed(n int) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(runID))
	return strconv.FormatUint(h.Sum64()+uint64(n), 10)
}

// genTree fills claim with a generated tree: `files` random files of `bytes` in total plus
// the special entries of e2e-tool gen, with contents from runSeed(seed).
func genTree(ns, claim string, seed, files int, bytes int64) toolresult.Gen {
	GinkgoHelper()
	var r toolresult.Gen
	tool(toolPod(ns, podName("gen"), claim, "gen", "-dir", "/data", "-seed", runSeed(seed),
		"-files", strconv.Itoa(files), "-bytes", strconv.FormatInt(bytes, 10)), &r)
	return r
}

// sumTree is the checker: the manifest (type, mode, owner, size, mtime, SHA-256) of every
// entry of claim.
func sumTree(ns, claim string) toolresult.Sum {
	GinkgoHelper()
	var r toolresult.Sum
	tool(toolPod(ns, podName("sum"), claim, "sum", "-dir", "/data"), &r)
	Expect(r.Entries).To(BeNumerically(">", 0), "empty tree in %s/%s", ns, claim)
	return r
}

// expectSameTree fails with the differing entries when two manifests differ.
func expectSameTree(got, want toolresult.Sum, what string) {
	GinkgoHelper()
	if got.Digest == want.Digest {
		return
	}
	Expect(got.Lines).To(Equal(want.Lines), "%s: the restored tree differs from the source", what)
	Fail(what + ": digests differ but lines are equal")
}

// ---- Revault objects -----------------------------------------------------------------------

func newSeries(ns, name, claim string, media backupv1alpha1.Media) *backupv1alpha1.BackupSeries {
	return &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: backupv1alpha1.BackupSeriesSpec{
			Source:  backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: claim}},
			Storage: backupv1alpha1.StorageSpec{Media: media},
		},
	}
}

func getSeries(ns, name string) *backupv1alpha1.BackupSeries {
	GinkgoHelper()
	bs := &backupv1alpha1.BackupSeries{}
	Expect(k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, bs)).To(Succeed())
	return bs
}

func condition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// waitSeriesReady waits until the series is placed on a worker that accepts the namespace's
// token (on-demand backups wait for that).
func waitSeriesReady(ns, name string) *backupv1alpha1.BackupSeries {
	GinkgoHelper()
	var bs *backupv1alpha1.BackupSeries
	Eventually(func(g Gomega) {
		bs = &backupv1alpha1.BackupSeries{}
		g.Expect(k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, bs)).To(Succeed())
		g.Expect(bs.Status.Worker).NotTo(BeNil(), "not placed: %v", bs.Status.Conditions)
		c := condition(bs.Status.Conditions, backupv1alpha1.ConditionTokenReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "TokenReady: %s", c.Message)
	}).WithTimeout(podTimeout).WithPolling(poll).Should(Succeed())
	return bs
}

// requestBackup asks for an on-demand backup: a new value of the backup-now annotation.
func requestBackup(ns, name, request string) {
	GinkgoHelper()
	bs := getSeries(ns, name)
	patch := client.MergeFrom(bs.DeepCopy())
	if bs.Annotations == nil {
		bs.Annotations = map[string]string{}
	}
	bs.Annotations[backupv1alpha1.BackupNowAnnotation] = request
	Expect(k.Patch(ctx, bs, patch)).To(Succeed())
}

// backupNow asks for an on-demand backup and waits until the series reports version `want` and
// no backup runs; it returns the series then.
func backupNow(ns, name, request string, want int64) *backupv1alpha1.BackupSeries {
	GinkgoHelper()
	requestBackup(ns, name, request)
	return waitVersion(ns, name, want)
}

func waitVersion(ns, name string, want int64) *backupv1alpha1.BackupSeries {
	GinkgoHelper()
	var bs *backupv1alpha1.BackupSeries
	Eventually(func(g Gomega) {
		bs = &backupv1alpha1.BackupSeries{}
		g.Expect(k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, bs)).To(Succeed())
		if lj := bs.Status.LastJob; lj != nil && !lj.Succeeded {
			StopTrying(fmt.Sprintf("backup Job %s failed: %s", lj.Name, lj.Message)).Now()
		}
		g.Expect(bs.Status.LatestVersion).To(Equal(want), "phase %s, conditions %v", bs.Status.Phase, bs.Status.Conditions)
		g.Expect(bs.Status.Phase).To(Equal(backupv1alpha1.SeriesReady))
	}).WithTimeout(backupTimeout).WithPolling(poll).Should(Succeed())
	return bs
}

func version(bs *backupv1alpha1.BackupSeries, n int64) *backupv1alpha1.BackupVersion {
	for i := range bs.Status.Versions {
		if bs.Status.Versions[i].Number == n {
			return &bs.Status.Versions[i]
		}
	}
	return nil
}

func versionNumbers(bs *backupv1alpha1.BackupSeries) []int64 {
	var ns []int64
	for _, v := range bs.Status.Versions {
		ns = append(ns, v.Number)
	}
	return ns
}

// expectRestore runs a RestoreJob `name` of series@version into a new PVC of the same name,
// waits for its end, and expects it to have restored version `want` into a tree the same as sum
// (what names the tree in a failure). It returns the RestoreJob.
func expectRestore(ns, name, series, version string, want int64, sum toolresult.Sum, what string) *backupv1alpha1.RestoreJob {
	GinkgoHelper()
	createPVC(ns, name)
	rj := &backupv1alpha1.RestoreJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: backupv1alpha1.RestoreJobSpec{
			SeriesRef: backupv1alpha1.LocalObjectReference{Name: series},
			Version:   version,
			TargetPVC: backupv1alpha1.PVCTarget{ClaimName: name},
		},
	}
	Expect(k.Create(ctx, rj)).To(Succeed())
	rj = waitRestoreDone(ns, name)
	expectRestoreSucceeded(rj, want)
	expectSameTree(sumTree(ns, name), sum, what)
	return rj
}

func waitRestoreDone(ns, name string) *backupv1alpha1.RestoreJob {
	GinkgoHelper()
	rj := &backupv1alpha1.RestoreJob{}
	Eventually(func(g Gomega) {
		g.Expect(k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, rj)).To(Succeed())
		g.Expect(rj.Status.Phase).To(BeElementOf(backupv1alpha1.RestoreSucceeded, backupv1alpha1.RestoreFailed),
			"conditions %v", rj.Status.Conditions)
	}).WithTimeout(backupTimeout).WithPolling(poll).Should(Succeed())
	return rj
}

func expectRestoreSucceeded(rj *backupv1alpha1.RestoreJob, version int64) {
	GinkgoHelper()
	Expect(rj.Status.Phase).To(Equal(backupv1alpha1.RestoreSucceeded), "conditions %v", rj.Status.Conditions)
	Expect(rj.Status.ResolvedVersion).To(Equal(version))
	c := condition(rj.Status.Conditions, backupv1alpha1.ConditionComplete)
	Expect(c).NotTo(BeNil())
	Expect(c.Status).To(Equal(metav1.ConditionTrue))
	Expect(rj.Status.RestoredBytes).To(Equal(rj.Status.TotalBytes))
}

// ---- workers -------------------------------------------------------------------------------

// storageNode is the node labelled revault.io/storage=media.
func storageNode(media string) string {
	GinkgoHelper()
	var nodes corev1.NodeList
	Expect(k.List(ctx, &nodes, client.MatchingLabels{storageLabel: media})).To(Succeed())
	Expect(nodes.Items).To(HaveLen(1))
	return nodes.Items[0].Name
}

// workerPod is the ready worker pod of a pool on a node.
func workerPod(media, node string) *corev1.Pod {
	GinkgoHelper()
	var pod *corev1.Pod
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k.List(ctx, &pods, client.InNamespace(systemNS),
			client.MatchingLabels{"app.kubernetes.io/component": "worker", "revault.io/pool": media})).To(Succeed())
		pod = nil
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName == node && p.DeletionTimestamp == nil && podReady(p) {
				pod = p
			}
		}
		g.Expect(pod).NotTo(BeNil(), "no ready %s worker pod on %s", media, node)
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// expectOperatorRunning: the operator Deployment has rolled out image, every replica ready.
func expectOperatorRunning(g Gomega, image string) {
	d := &appsv1.Deployment{}
	g.Expect(k.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: operatorDep}, d)).To(Succeed())
	g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(image))
	g.Expect(d.Status.ObservedGeneration).To(Equal(d.Generation))
	g.Expect(d.Status.UpdatedReplicas).To(Equal(*d.Spec.Replicas))
	g.Expect(d.Status.AvailableReplicas).To(Equal(*d.Spec.Replicas))
	ready := 0
	for _, p := range operatorPods(g) {
		if podReady(&p) {
			ready++
		}
	}
	g.Expect(ready).To(Equal(int(*d.Spec.Replicas)))
}

// expectPoolRunning: the pool's DaemonSet has rolled out image to its one node, and that pod
// is ready.
func expectPoolRunning(g Gomega, media, image string) {
	ds := &appsv1.DaemonSet{}
	g.Expect(k.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: "revault-worker-" + media}, ds)).To(Succeed())
	g.Expect(ds.Spec.Template.Spec.Containers[0].Image).To(Equal(image))
	g.Expect(ds.Status.ObservedGeneration).To(Equal(ds.Generation))
	g.Expect(ds.Status.DesiredNumberScheduled).To(Equal(int32(1)))
	g.Expect(ds.Status.NumberReady).To(Equal(int32(1)))
	g.Expect(ds.Status.UpdatedNumberScheduled).To(Equal(int32(1)))
}

// workerService is the operator's per-node Service of a pool's worker.
func workerService(media, node string) string { return "revault-worker-" + media + "-" + node }

// workerEndpoint is what Job pods use to reach that worker.
func workerEndpoint(media, node string) string {
	return fmt.Sprintf("https://%s.%s.svc:8420", workerService(media, node), systemNS)
}

// workerMetrics reads a worker's /metrics (no token needed) through the API server's service
// proxy and returns the samples by name (labels included as written).
func workerMetrics(media, node string) (map[string]float64, error) {
	raw, err := cs.CoreV1().Services(systemNS).ProxyGet("https", workerService(media, node), "8420", "/metrics", nil).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, nil
}

// storedBytes is the worker's revault_stored_bytes: the bytes of all its containers on disk.
func storedBytes(media, node string) int64 {
	GinkgoHelper()
	var v float64
	Eventually(func(g Gomega) {
		m, err := workerMetrics(media, node)
		g.Expect(err).NotTo(HaveOccurred())
		var ok bool
		v, ok = m["revault_stored_bytes"]
		g.Expect(ok).To(BeTrue(), "no revault_stored_bytes in the %s worker's metrics", media)
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	return int64(v)
}

// ---- Jobs ------------------------------------------------------------------------------------

// backupJobs lists the backup Jobs of a series.
func backupJobs(ns, series string) []batchv1.Job {
	GinkgoHelper()
	var jobs batchv1.JobList
	Expect(k.List(ctx, &jobs, client.InNamespace(ns),
		client.MatchingLabels{"app.kubernetes.io/component": "backup", "revault.io/series": series})).To(Succeed())
	return jobs.Items
}

// jobAttempts tells the story of a backup Job that failed, for its failure message: each of its
// pods (the Job retries a failed pod) with when it ran and what it printed last, and the lines
// of the series' worker log (media, node) that name the series. A retry refused because the
// series "already has a backup in progress" says nothing of the attempt before it otherwise.
func jobAttempts(ns, job, series, media, node string) string {
	var b strings.Builder
	var pods corev1.PodList
	if err := k.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{batchv1.JobNameLabel: job}); err != nil {
		return fmt.Sprintf("(listing the pods of Job %s: %v)", job, err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  pod %s (created %s): %s", p.Name, p.CreationTimestamp.Format(time.TimeOnly), p.Status.Phase)
		for _, c := range p.Status.ContainerStatuses {
			if t := c.State.Terminated; t != nil {
				fmt.Fprintf(&b, ", ran %s-%s, exit %d %s: %s", t.StartedAt.Format(time.TimeOnly),
					t.FinishedAt.Format(time.TimeOnly), t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
			}
		}
	}
	if media == "" {
		return b.String()
	}
	// No waiting and no assertion here: a missing worker must not hide the Job's failure.
	var workers corev1.PodList
	if err := k.List(ctx, &workers, client.InNamespace(systemNS),
		client.MatchingLabels{"app.kubernetes.io/component": "worker", "revault.io/pool": media}); err != nil {
		return b.String() + fmt.Sprintf("\n  (listing the %s workers: %v)", media, err)
	}
	var pod *corev1.Pod
	for i := range workers.Items {
		if workers.Items[i].Spec.NodeName == node {
			pod = &workers.Items[i]
		}
	}
	if pod == nil {
		return b.String() + fmt.Sprintf("\n  (no %s worker pod on %s)", media, node)
	}
	logs, err := cs.CoreV1().Pods(systemNS).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return b.String() + fmt.Sprintf("\n  (the log of worker %s: %v)", pod.Name, err)
	}
	fmt.Fprintf(&b, "\n  worker %s on the series:", pod.Name)
	for _, line := range strings.Split(string(logs), "\n") {
		if strings.Contains(line, ns+"/"+series) {
			b.WriteString("\n    " + line)
		}
	}
	return b.String()
}

// expectInvalid asserts the API server rejected obj as invalid with msg in the message.
func expectInvalid(err error, msg string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the API server accepted an invalid object (wanted %q)", msg)
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
	Expect(err.Error()).To(ContainSubstring(msg))
}

// events lists the events of an object.
func events(ns, name string) []corev1.Event {
	GinkgoHelper()
	var evs corev1.EventList
	Expect(k.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var out []corev1.Event
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func eventReasons(evs []corev1.Event) []string {
	var r []string
	for _, e := range evs {
		r = append(r, e.Reason)
	}
	return r
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// slowJobs caps the CPU of containers without a limit in ns at 25 millicores (what the suite's
// Helm values make Job pods request; a lower limit would be invalid), so a backup stream lasts
// long enough for something to happen during it: `revault push` needs ~0.4 CPU-seconds for
// 384 MiB, ~15 s under the cap (~3 s without). Delete the LimitRange to lift the cap.
func slowJobs(ns string) *corev1.LimitRange {
	GinkgoHelper()
	lr := &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "slow-backup", Namespace: ns},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type:    corev1.LimitTypeContainer,
			Default: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("25m")},
		}}},
	}
	Expect(k.Create(ctx, lr)).To(Succeed())
	return lr
}

// waitStreaming waits until the worker of media on node receives a backup stream: a backup in
// flight and more bytes received than before (received0, its revault_received_bytes_total).
func waitStreaming(media, node string, received0 float64) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		m, err := workerMetrics(media, node)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(m["revault_inflight_backups"]).To(BeNumerically(">=", 1))
		g.Expect(m["revault_received_bytes_total"]).To(BeNumerically(">", received0))
	}).WithTimeout(podTimeout).WithPolling(200 * time.Millisecond).Should(Succeed())
}
