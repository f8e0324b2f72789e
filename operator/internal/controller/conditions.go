package controller

import (
	"context"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// negativeConditions are the condition types whose True is bad news.
var negativeConditions = map[string]bool{backupv1alpha1.ConditionFailed: true, backupv1alpha1.ConditionBackupOverdue: true,
	backupv1alpha1.ConditionDiskPressure: true, backupv1alpha1.ConditionQuotaExceeded: true}

// conditionSetter sets conditions on one object and records an event for every transition (a
// new condition, or a change of status or reason), so `kubectl describe` tells the story.
type conditionSetter struct {
	rec        record.EventRecorder
	obj        runtime.Object
	conds      *[]metav1.Condition
	generation int64
}

func (c conditionSetter) set(typ string, status metav1.ConditionStatus, reason, msg string) {
	bad := (status == metav1.ConditionFalse) != negativeConditions[typ]
	c.record(typ, status, reason, msg, bad)
}

// waiting sets a condition False without a warning: the object waits for something that is
// expected to happen (a token to load, a worker to be placed, a Job to finish).
func (c conditionSetter) waiting(typ, reason, msg string) {
	c.record(typ, metav1.ConditionFalse, reason, msg, false)
}

func (c conditionSetter) record(typ string, status metav1.ConditionStatus, reason, msg string, bad bool) {
	old := apimeta.FindStatusCondition(*c.conds, typ)
	changed := old == nil || old.Status != status || old.Reason != reason
	apimeta.SetStatusCondition(c.conds, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: c.generation,
	})
	if !changed {
		return
	}
	if status == metav1.ConditionUnknown {
		bad = false
	}
	evType := "Normal"
	if bad {
		evType = "Warning"
	}
	note := typ + " is " + string(status)
	if msg != "" {
		note += ": " + msg
	}
	c.rec.Event(c.obj, evType, reason, truncate(note, 1024))
}

func (c conditionSetter) setTrue(typ, reason, msg string) {
	c.set(typ, metav1.ConditionTrue, reason, msg)
}

func (c conditionSetter) setFalse(typ, reason, msg string) {
	c.set(typ, metav1.ConditionFalse, reason, msg)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// patchStatus writes obj's status as a merge patch against the object as read (asRead sets a
// copy of obj back to its status as read): only what changed is sent, so fields this operator
// does not know survive, and the patch carries the resourceVersion read, so a write based on a
// stale read fails with a conflict (and the reconcile is retried) instead of undoing a newer
// one, e.g. a series' placement.
func patchStatus[T client.Object](ctx context.Context, c client.Client, obj T, asRead func(T)) error {
	base := obj.DeepCopyObject().(T)
	asRead(base)
	return c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}
