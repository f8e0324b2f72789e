package controller

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/revault-io/revault/operator/internal/plan"
)

// How a Job pod's result reaches status: revault push/pull --json print a JSON report (or a
// JSON error and an "error: ..." line). The container's terminationMessagePolicy is
// FallbackToLogsOnError, so on failure the kubelet puts the log's tail (with the worker's
// message) into the termination message. On success the report is read from the termination
// message when the image wrote one there, otherwise from the last lines of the pod's log.

// PodOutputReader returns what a finished Job pod printed.
type PodOutputReader interface {
	Output(ctx context.Context, pod *corev1.Pod) (string, error)
}

// podOutput reads termination messages and, failing that, logs through the API server.
type podOutput struct {
	clientset kubernetes.Interface
}

// NewPodOutputReader reads pod output with clientset (nil: termination messages only).
func NewPodOutputReader(cs kubernetes.Interface) PodOutputReader { return podOutput{clientset: cs} }

func terminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "revault" && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	return nil
}

func (o podOutput) Output(ctx context.Context, p *corev1.Pod) (string, error) {
	if t := terminated(p); t != nil && strings.TrimSpace(t.Message) != "" {
		return t.Message, nil
	}
	if o.clientset == nil {
		return "", nil
	}
	b, err := o.clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{
		Container: "revault",
		// The whole pretty-printed report: a backup report with its automatic slide and
		// expiry runs past 60 lines (40 cut its head off, and with it the version).
		TailLines:  ptr.To(int64(1000)),
		LimitBytes: ptr.To(int64(64 << 10)),
	}).DoRaw(ctx)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// jobResult is a finished Job's outcome.
type jobResult struct {
	done      bool
	succeeded bool
	at        time.Time
	message   string
}

func jobFinished(j *batchv1.Job) jobResult {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			at := c.LastTransitionTime.Time
			if j.Status.CompletionTime != nil {
				at = j.Status.CompletionTime.Time
			}
			return jobResult{done: true, succeeded: true, at: at}
		case batchv1.JobFailed:
			msg := c.Reason
			if c.Message != "" {
				msg = c.Reason + ": " + c.Message
			}
			return jobResult{done: true, at: c.LastTransitionTime.Time, message: msg}
		}
	}
	return jobResult{}
}

// failure is why a failed Job failed: the worker's error from its pod's output when the pod
// printed one, else the Job's failure condition.
func (r jobResult) failure(out plan.JobOutput) string {
	if out.Error != "" {
		return out.Error
	}
	return r.message
}

// newestTerminatedPod is the Job's most recent pod whose container has exited.
func newestTerminatedPod(ctx context.Context, c client.Reader, j *batchv1.Job) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(j.Namespace),
		client.MatchingLabels{batchv1.JobNameLabel: j.Name}); err != nil {
		return nil, err
	}
	var done []corev1.Pod
	for _, p := range pods.Items {
		if terminated(&p) != nil && metav1OwnedBy(&p, j) {
			done = append(done, p)
		}
	}
	if len(done) == 0 {
		return nil, nil
	}
	sort.Slice(done, func(i, k int) bool {
		return terminated(&done[i]).FinishedAt.After(terminated(&done[k]).FinishedAt.Time)
	})
	return &done[0], nil
}

func metav1OwnedBy(p *corev1.Pod, j *batchv1.Job) bool {
	for _, o := range p.OwnerReferences {
		if o.UID == j.UID {
			return true
		}
	}
	return false
}

// errNoPodYet: a finished Job's pod is not in the cache (yet). Jobs and pods arrive through
// separate watches, so a Job's completion can be seen before its pod's final status.
var errNoPodYet = errors.New("no finished pod of the Job is visible")

// podGrace is how long after a Job finished its pod's report is waited for; after that the pod
// is taken to be gone (deleted by its TTL or by hand) and the Job to have left no report.
const podGrace = 30 * time.Second

// outputPending reports whether a report that could not be read may still arrive: the Job
// finished less than podGrace ago.
func outputPending(err error, finishedAt time.Time) bool {
	return err != nil && time.Since(finishedAt) < podGrace
}

// jobOutput parses what the Job's newest finished pod printed (errNoPodYet when no finished pod
// is visible).
func jobOutput(ctx context.Context, c client.Reader, r PodOutputReader, j *batchv1.Job) (plan.JobOutput, error) {
	p, err := newestTerminatedPod(ctx, c, j)
	if err != nil {
		return plan.JobOutput{}, err
	}
	if p == nil {
		return plan.JobOutput{}, errNoPodYet
	}
	text, err := r.Output(ctx, p)
	if err != nil {
		return plan.JobOutput{}, err
	}
	return plan.ParseJobOutput(text), nil
}
