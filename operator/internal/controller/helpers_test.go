package controller

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// getSeries fetches a BackupSeries.
func getSeries(ns, name string) *backupv1alpha1.BackupSeries {
	bs := &backupv1alpha1.BackupSeries{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, bs)).To(Succeed())
	return bs
}

// updateSeries applies mutate to the newest spec of a BackupSeries (retrying when the operator
// changed the object in between).
func updateSeries(ns, name string, mutate func(*backupv1alpha1.BackupSeriesSpec)) {
	Eventually(func() error {
		bs := getSeries(ns, name)
		mutate(&bs.Spec)
		return k8sClient.Update(ctx, bs)
	}).Should(Succeed())
}

// placedSeries creates bs and waits until the operator placed it.
func placedSeries(bs *backupv1alpha1.BackupSeries) *backupv1alpha1.BackupSeries {
	Expect(k8sClient.Create(ctx, bs)).To(Succeed())
	var cur *backupv1alpha1.BackupSeries
	Eventually(func(g Gomega) {
		cur = &backupv1alpha1.BackupSeries{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(bs), cur)).To(Succeed())
		g.Expect(cur.Status.Worker).NotTo(BeNil())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	return cur
}

// nsTokenFile writes the namespace's scoped token (from the Secret the operator made for Job
// pods) to a file, as the Secret volume of a Job pod would.
func nsTokenFile(ns string) string {
	sec := &corev1.Secret{}
	Eventually(func() error {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.NamespaceTokenSecret}, sec)
	}).Should(Succeed())
	path := filepath.Join(scratch, "token-"+ns)
	Expect(os.WriteFile(path, sec.Data[plan.NamespaceTokenKey], 0o600)).To(Succeed())
	return path
}

// waitToken waits until node's worker accepts the namespace's token: the test's token file sync
// (playing the kubelet) and the worker's reload take a moment, as they do in a cluster.
func waitToken(ns, node string) {
	tok, err := os.ReadFile(nsTokenFile(ns))
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error {
		params := &workerclient.ListSeriesParams{Namespace: &ns}
		return workerclient.Done(workerClient(node, string(tok)).ListSeriesWithResponse(ctx, params))
	}).WithTimeout(20 * time.Second).Should(Succeed())
}

// runRevault runs the revault CLI and returns stdout, stderr and whether it exited 0.
func runRevault(args ...string) (string, string, bool) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, revault, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err == nil
}

// push backs up dir as the next version of ns/name on node's worker with the namespace's token:
// what the backup Job's pod does.
func push(ns, name, node, dir string, extra ...string) string {
	tokenFile := nsTokenFile(ns)
	waitToken(ns, node)
	args := append([]string{"--json", "--quiet", "push", "--server", workerURL[node],
		"--token-file", tokenFile, "--series", plan.SeriesID(ns, name)}, extra...)
	out, errOut, ok := runRevault(append(args, dir)...)
	Expect(ok).To(BeTrue(), "revault push: %s%s", out, errOut)
	return out
}

// runJobPod plays a backup or restore Job's pod: the Job's own arguments, with the worker's
// loopback URL, a token file and dir in place of the in-cluster ones.
func runJobPod(job *batchv1.Job, ns, node, dir string) (string, bool) {
	args := append([]string(nil), job.Spec.Template.Spec.Containers[0].Args...)
	for i := range args {
		switch {
		case i > 0 && args[i-1] == "--server":
			args[i] = workerURL[node]
		case i > 0 && args[i-1] == "--token-file":
			args[i] = nsTokenFile(ns)
		case args[i] == plan.JobDataDir: // a backup's source
			args[i] = dir
		case args[i] == plan.JobDataDir+"/": // a restore's target
			args[i] = dir + "/"
		}
	}
	out, errOut, ok := runRevault(args...)
	return out + errOut, ok
}

// startStdinPush starts `revault push -` of ns/series on node's worker and writes it 24 MiB,
// byte j of MiB i being fill(i, j), leaving stdin open: the push is still running when this
// returns. finish ends it (and expects it to succeed).
func startStdinPush(ns, series, node string, fill func(i, j int) byte) (finish func()) {
	cmd := exec.CommandContext(ctx, revault, "--quiet", "push", "--server", workerURL[node],
		"--token-file", nsTokenFile(ns), "--series", plan.SeriesID(ns, series), "-")
	stdin, err := cmd.StdinPipe()
	Expect(err).NotTo(HaveOccurred())
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	// A spec that fails before finish must not leave the push holding the worker's only
	// backup slot (the suite's workers run --max-backups 1): every later push would wait.
	DeferCleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	block := make([]byte, 1<<20)
	for i := 0; i < 24; i++ {
		for j := range block {
			block[j] = fill(i, j)
		}
		_, err := stdin.Write(block)
		Expect(err).NotTo(HaveOccurred())
	}
	return func() {
		Expect(stdin.Close()).To(Succeed())
		Expect(cmd.Wait()).To(Succeed())
	}
}

// randomTree writes a directory of files with fresh random content (about kib KiB in all).
func randomTree(kib int) string {
	dir, err := os.MkdirTemp(scratch, "tree-")
	Expect(err).NotTo(HaveOccurred())
	Expect(os.MkdirAll(filepath.Join(dir, "sub"), 0o755)).To(Succeed())
	for i := 0; i < 4; i++ {
		b := make([]byte, kib*1024/4)
		_, _ = rand.Read(b)
		p := filepath.Join(dir, fmt.Sprintf("file-%d.bin", i))
		if i%2 == 1 {
			p = filepath.Join(dir, "sub", fmt.Sprintf("file-%d.bin", i))
		}
		Expect(os.WriteFile(p, b, 0o644)).To(Succeed())
	}
	return dir
}

// finishJob plays the Job controller and the kubelet for a Job whose pod ran and exited with
// output as its termination message (exit 0 when succeeded).
func finishJob(job *batchv1.Job, succeeded bool, output string) {
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job)).To(Succeed())
	labels := map[string]string{}
	for k, v := range job.Spec.Template.Labels {
		labels[k] = v
	}
	labels[batchv1.JobNameLabel] = job.Name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: job.Name + "-",
			Namespace:    job.Namespace,
			Labels:       labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true),
			}},
		},
		Spec: *job.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-ssd-1"
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	start := metav1.NewTime(time.Now().Add(-2 * time.Second).Truncate(time.Second))
	end := metav1.NewTime(time.Now().Truncate(time.Second))
	exit, phase := int32(0), corev1.PodSucceeded
	if !succeeded {
		exit, phase = 1, corev1.PodFailed
	}
	pod.Status = corev1.PodStatus{
		Phase: phase,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "revault", Image: job.Spec.Template.Spec.Containers[0].Image, ImageID: "sha256:test",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exit, Message: output, StartedAt: start, FinishedAt: end,
				Reason: map[bool]string{true: "Completed", false: "Error"}[succeeded],
			}},
		}},
	}
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())

	Eventually(func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		job.Status.StartTime = &start
		if succeeded {
			job.Status.Succeeded = 1
			job.Status.CompletionTime = &end
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: end},
				{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: end},
			}
		} else {
			job.Status.Failed = 1
			job.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, LastTransitionTime: end,
					Reason: batchv1.JobReasonBackoffLimitExceeded, Message: "Job has reached the specified backoff limit"},
				{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, LastTransitionTime: end,
					Reason: batchv1.JobReasonBackoffLimitExceeded, Message: "Job has reached the specified backoff limit"},
			}
		}
		return k8sClient.Status().Update(ctx, job)
	}).Should(Succeed())
}

// objectEvents maps each event recorded for an object through f. The recorder sends events
// asynchronously: assert on them with Eventually.
func objectEvents(obj client.Object, f func(corev1.Event) string) []string {
	var evs corev1.EventList
	Expect(k8sClient.List(ctx, &evs, client.InNamespace(obj.GetNamespace()))).To(Succeed())
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.UID == obj.GetUID() {
			out = append(out, f(e))
		}
	}
	return out
}

// eventNotes lists "reason: message" of the events recorded for an object.
func eventNotes(obj client.Object) []string {
	return objectEvents(obj, func(e corev1.Event) string { return e.Reason + ": " + e.Message })
}

// eventReasons lists the reasons of the events recorded for an object.
func eventReasons(obj client.Object) []string {
	return objectEvents(obj, func(e corev1.Event) string { return e.Reason })
}

// metricValue reads one sample of the operator's metrics from controller-runtime's registry
// (what the metrics endpoint serves); labels are name=value pairs.
func metricValue(name string, labels ...string) float64 {
	mfs, err := crmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for _, kv := range labels {
				k, v, _ := strings.Cut(kv, "=")
				if have[k] != v {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// condition returns a condition of a list (one with Status "Absent" if there is none).
func condition(conds []metav1.Condition, typ string) metav1.Condition {
	for _, c := range conds {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{Type: typ, Status: "Absent"}
}

// annotate sets (or with "" removes) an annotation of obj, retrying on conflicts.
func annotate(obj client.Object, key, value string) {
	GinkgoHelper()
	Eventually(func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		a := obj.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		if value == "" {
			delete(a, key)
		} else {
			a[key] = value
		}
		obj.SetAnnotations(a)
		return k8sClient.Update(ctx, obj)
	}).Should(Succeed())
}
