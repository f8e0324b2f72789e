package controller

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// Every transition of a condition (status or reason) is one event; repeating the same state is
// none; the event type follows the condition's polarity.
func TestConditionEvents(t *testing.T) {
	rec := record.NewFakeRecorder(20)
	bs := &backupv1alpha1.BackupSeries{ObjectMeta: metav1.ObjectMeta{Generation: 4}}
	cs := conditionSetter{rec: rec, obj: bs, conds: &bs.Status.Conditions, generation: bs.Generation}

	cs.waiting(backupv1alpha1.ConditionTokenReady, "TokenPending", "waiting")
	cs.waiting(backupv1alpha1.ConditionTokenReady, "TokenPending", "still waiting") // same state
	cs.setTrue(backupv1alpha1.ConditionTokenReady, "TokenAccepted", "ok")
	cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", "connection refused")
	cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", "timeout") // same status and reason
	cs.setTrue(backupv1alpha1.ConditionFailed, "RestoreFailed", "no version 3")
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	want := []string{
		"Normal TokenPending TokenReady is False: waiting",
		"Normal TokenAccepted TokenReady is True: ok",
		"Warning WorkerError Synced is False: connection refused",
		"Warning RestoreFailed Failed is True: no version 3",
	}
	if len(got) != len(want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %q, want %q", i, got[i], want[i])
		}
	}
	for _, c := range bs.Status.Conditions {
		if c.ObservedGeneration != 4 {
			t.Errorf("condition %s has observedGeneration %d", c.Type, c.ObservedGeneration)
		}
	}
	if c := apimeta.FindStatusCondition(bs.Status.Conditions, backupv1alpha1.ConditionSynced); c.Message != "timeout" {
		t.Errorf("the message must follow the latest state: %q", c.Message)
	}
}

func TestParseOverrides(t *testing.T) {
	m, err := ParseOverrides(" node-1=http://127.0.0.1:1234, node-2=https://w:8420 ,", false)
	if err != nil || len(m) != 2 || m["node-1"] != "http://127.0.0.1:1234" || m["node-2"] != "https://w:8420" {
		t.Fatalf("ParseOverrides = %v, %v", m, err)
	}
	for _, bad := range []string{"node-1", "=http://x", "node=ftp://x", "node=httpx://x"} {
		if _, err := ParseOverrides(bad, false); err == nil {
			t.Errorf("ParseOverrides(%q) accepted", bad)
		}
	}
	// With TLS on, a plain-HTTP override would carry the admin token in clear.
	if _, err := ParseOverrides("node-2=https://w:8420", true); err != nil {
		t.Error(err)
	}
	if _, err := ParseOverrides("node-1=http://127.0.0.1:1234", true); err == nil || !strings.Contains(err.Error(), "must be https://") {
		t.Errorf("an http:// override with TLS on: %v", err)
	}
}

// A Job or RestoreJob annotated with plan.DataMoverRef maps back to its DataUpload or
// DataDownload, and to nothing else.
func TestDataMoverOwner(t *testing.T) {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		plan.AnnotationDataMover: plan.DataMoverRef("DataUpload", "velero", "backup-1-abcde")}}}
	reqs := dataMoverOwner(job, "DataUpload")
	if len(reqs) != 1 || reqs[0].Namespace != "velero" || reqs[0].Name != "backup-1-abcde" {
		t.Fatalf("dataMoverOwner = %v", reqs)
	}
	if reqs := dataMoverOwner(job, "DataDownload"); reqs != nil {
		t.Errorf("another kind's owner: %v", reqs)
	}
	for _, ann := range []string{"", "DataUpload", "DataUpload velero"} {
		job.Annotations[plan.AnnotationDataMover] = ann
		if reqs := dataMoverOwner(job, "DataUpload"); reqs != nil {
			t.Errorf("annotation %q: %v", ann, reqs)
		}
	}
}
