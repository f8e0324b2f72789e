package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/workerapi"
)

// RetentionPolicyReconciler pushes a policy's rules to the worker of every series that uses it,
// applies them (slide, then expire) right after they change and on the policy's expiry
// schedule, and reports what that did.
type RetentionPolicyReconciler struct {
	client.Client
	// Reader reads policies uncached (see Reconcile); nil: the cached client.
	Reader     client.Reader
	Recorder   record.EventRecorder
	Workers    *Workers
	SyncPeriod time.Duration
	Now        func() time.Time
}

// +kubebuilder:rbac:groups=backup.revault.io,resources=retentionpolicies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=retentionpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=backup.revault.io,resources=backupseries,verbs=get;list;watch

// Rules turns a policy spec into the worker's retention and the operator's plan rules.
func Rules(spec backupv1alpha1.RetentionPolicySpec) (workerapi.Retention, plan.RetentionRules) {
	var wr workerapi.Retention
	var pr plan.RetentionRules
	if spec.KeepVersions != nil {
		k := int64(*spec.KeepVersions)
		wr.Keep, pr.KeepVersions = &k, &k
	}
	if spec.KeepWithin != nil {
		d := spec.KeepWithin.Duration
		secs := int64(d / time.Second)
		wr.KeepWithinSeconds, pr.KeepWithin = &secs, &d
	}
	wr.Live = 1
	if spec.LiveVersions != nil {
		wr.Live = int64(*spec.LiveVersions)
	}
	// Without an expiry schedule the worker applies the rules after every backup.
	wr.Auto = spec.ExpirySchedule == ""
	return wr, pr
}

// Reconcile applies one RetentionPolicy.
func (r *RetentionPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("retentionpolicy", err) }()

	// Slides and expiries cannot be undone, and their report (lastExpired, bytesReclaimed) exists
	// only in the status this reconcile writes: it must not be lost to a write conflict, after
	// which the retry would find nothing left to expire and report nothing. So the policy is read
	// uncached (the cache can lag behind this controller's previous status write, which is what
	// conflicted) and the status is written with a patch, which no spec change can conflict with.
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	rp := &backupv1alpha1.RetentionPolicy{}
	if err := reader.Get(ctx, req.NamespacedName, rp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := rp.DeepCopy()
	orig := &base.Status
	st := &rp.Status
	cs := conditionSetter{rec: r.Recorder, obj: rp, conds: &st.Conditions, generation: rp.Generation}
	now := r.Now()
	requeue := r.SyncPeriod

	// When is the next scheduled expiry, and is one due now?
	due := false
	var next time.Time
	if rp.Spec.ExpirySchedule != "" {
		n, serr := nextExpiry(rp)
		if serr != nil {
			cs.setFalse(backupv1alpha1.ConditionScheduled, "InvalidSchedule", serr.Error())
		} else {
			next, due = n, !now.Before(n)
			cs.setTrue(backupv1alpha1.ConditionScheduled, "Scheduled", "expiry runs on "+rp.Spec.ExpirySchedule)
		}
	} else {
		cs.setTrue(backupv1alpha1.ConditionScheduled, "AfterEveryBackup", "no expirySchedule: the worker applies the policy after every backup")
	}

	var series backupv1alpha1.BackupSeriesList
	if err := r.List(ctx, &series, client.InNamespace(rp.Namespace), client.MatchingFields{indexRetentionRef: rp.Name}); err != nil {
		return ctrl.Result{}, err
	}
	sort.Slice(series.Items, func(i, j int) bool { return series.Items[i].Name < series.Items[j].Name })
	wr, rules := Rules(rp.Spec)

	prev := map[string]backupv1alpha1.SeriesRetentionStatus{}
	for _, s := range st.Series {
		prev[s.Name] = s
	}
	var entries []backupv1alpha1.SeriesRetentionStatus
	var failures, waiting []string
	ran := false
	for i := range series.Items {
		bs := &series.Items[i]
		if !bs.DeletionTimestamp.IsZero() {
			continue
		}
		e := prev[bs.Name]
		if e.UID != string(bs.UID) {
			// A new series under an old name starts from scratch.
			e = backupv1alpha1.SeriesRetentionStatus{UID: string(bs.UID)}
		}
		e.Name = bs.Name
		if bs.Status.Worker == nil {
			e.Message = "waiting for the series to be placed on a worker"
			waiting = append(waiting, bs.Name)
			entries = append(entries, e)
			continue
		}
		changed := e.AppliedGeneration != rp.Generation
		did, err := r.applyToSeries(ctx, rp, bs, &e, wr, rules, changed || due)
		ran = ran || did
		if err != nil {
			o.workerFailed = true
			e.Message = err.Error()
			failures = append(failures, fmt.Sprintf("%s: %v", bs.Name, err))
		} else {
			e.Message = ""
			e.AppliedGeneration = rp.Generation
		}
		entries = append(entries, e)
	}
	st.Series = entries
	st.SeriesCount = int32(len(entries))
	// A scheduled run that failed somewhere is retried (slide and expire are idempotent).
	if ran && (!due || len(failures) == 0) {
		t := metav1.NewTime(now)
		st.LastSlideTime, st.LastExpiryTime = &t, &t
	}
	st.NextExpiryTime = nil
	if !next.IsZero() {
		// After this run, from the (possibly just updated) last expiry.
		if n, err := nextExpiry(rp); err == nil {
			nt := metav1.NewTime(n)
			st.NextExpiryTime = &nt
			if d := n.Sub(now); d < requeue {
				requeue = max(d, time.Second)
			}
		}
	}

	switch {
	case len(failures) > 0:
		cs.setFalse(backupv1alpha1.ConditionApplied, "WorkerError", joinMax(failures, 3))
		requeue = min(requeue, 30*time.Second)
	case len(waiting) > 0:
		o.waiting = true
		cs.waiting(backupv1alpha1.ConditionApplied, "WaitingForPlacement", "not placed yet: "+strings.Join(waiting, ", "))
		requeue = min(requeue, 15*time.Second)
	case len(entries) == 0:
		cs.setTrue(backupv1alpha1.ConditionApplied, "NoSeries", "no BackupSeries references this policy")
	default:
		cs.setTrue(backupv1alpha1.ConditionApplied, "Applied",
			fmt.Sprintf("generation %d applied to %d series", rp.Generation, len(entries)))
	}
	st.ObservedGeneration = rp.Generation
	if !equality.Semantic.DeepEqual(orig, st) {
		if err := r.Status().Patch(ctx, rp, client.MergeFrom(base)); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// SetupWithManager watches policies and the series that reference them.
func (r *RetentionPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&backupv1alpha1.RetentionPolicy{}).
		Watches(&backupv1alpha1.BackupSeries{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			bs, ok := o.(*backupv1alpha1.BackupSeries)
			if !ok || bs.Spec.RetentionPolicyRef == nil {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.RetentionPolicyRef.Name}}}
		})).
		Complete(r)
}
