package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// heldEvents is an EventRecorder that keeps the events of one reconcile until the status they
// describe is stored (flush). A status write that conflicts is retried by a new reconcile,
// which sees the same transitions again: emitting them at once told every transition twice
// and, past the API's per-object event burst (25), later events were dropped.
type heldEvents struct {
	rec  record.EventRecorder
	held []func()
}

var _ record.EventRecorder = (*heldEvents)(nil)

func holdEvents(rec record.EventRecorder) *heldEvents { return &heldEvents{rec: rec} }

func (h *heldEvents) Event(obj runtime.Object, typ, reason, msg string) {
	h.held = append(h.held, func() { h.rec.Event(obj, typ, reason, msg) })
}

func (h *heldEvents) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	h.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (h *heldEvents) AnnotatedEventf(obj runtime.Object, annotations map[string]string, typ, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.held = append(h.held, func() { h.rec.AnnotatedEventf(obj, annotations, typ, reason, "%s", msg) })
}

// flush emits the held events, in order, once.
func (h *heldEvents) flush() {
	for _, e := range h.held {
		e()
	}
	h.held = nil
}
