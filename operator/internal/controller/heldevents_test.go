package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

// Events of a reconcile reach the API only once its status is stored, in order and once.
func TestHeldEventsWaitForTheStatusWrite(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	h := holdEvents(rec)
	obj := &corev1.ConfigMap{}
	h.Event(obj, "Normal", "Placed", "on n1")
	h.Eventf(obj, "Warning", "JobFailed", "job %s failed", "j1")
	if len(rec.Events) != 0 {
		t.Fatal("an event left before the status was stored")
	}
	h.flush()
	h.flush()
	want := []string{"Normal Placed on n1", "Warning JobFailed job j1 failed"}
	for _, w := range want {
		if got := <-rec.Events; got != w {
			t.Fatalf("event %q, want %q", got, w)
		}
	}
	if len(rec.Events) != 0 {
		t.Fatal("an event was emitted twice")
	}
}
