package controller

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A finished backup Job created at `created` whose condition changed at `finished`.
func finishedJob(name string, created, finished time.Time, ok bool) *batchv1.Job {
	c := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(finished), Reason: "BackoffLimitExceeded"}
	if ok {
		c.Type = batchv1.JobComplete
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Status:     batchv1.JobStatus{Conditions: []batchv1.JobCondition{c}},
	}
}

// Kubernetes keeps times to the second: two on-demand backups that finish within one second must
// still report the later one (here the failed second backup, whose name sorts first).
func TestTheNewestFinishedJobIsTheLaterOne(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 5, 4, 32, 0, time.UTC)
	first := finishedJob("db-now-a7937b64", t0, t0.Add(2*time.Second), true)
	second := finishedJob("db-now-16367aac", t0.Add(2*time.Second), t0.Add(2*time.Second), false)
	running := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "db-now-zzz", CreationTimestamp: metav1.NewTime(t0)}}
	for _, order := range [][]*batchv1.Job{{first, second, running}, {running, second, first}} {
		active, newest, res := tallyJobs(order)
		if active != 1 {
			t.Errorf("active = %d, want 1", active)
		}
		if newest != second || res.succeeded {
			t.Errorf("newest = %s (succeeded %v), want the failed %s", newest.Name, res.succeeded, second.Name)
		}
	}
	// Finished later wins over created later; with every time equal, the greater name.
	late := finishedJob("a", t0, t0.Add(3*time.Second), true)
	if _, newest, _ := tallyJobs([]*batchv1.Job{second, late}); newest != late {
		t.Errorf("newest = %s, want the one that finished last", newest.Name)
	}
	x, y := finishedJob("x", t0, t0, true), finishedJob("y", t0, t0, true)
	if _, newest, _ := tallyJobs([]*batchv1.Job{y, x}); newest != y {
		t.Errorf("newest = %s, want y", newest.Name)
	}
}
