package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
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

// Rules turns a policy spec into the worker's retention. What the rules expire is the worker's
// to decide (and to report: its series' pendingExpiry), so they are not evaluated here.
func Rules(spec backupv1alpha1.RetentionPolicySpec) workerclient.Retention {
	var wr workerclient.Retention
	if spec.KeepVersions != nil {
		k := int64(*spec.KeepVersions)
		wr.Keep = &k
	}
	if spec.KeepWithin != nil {
		secs := int64(spec.KeepWithin.Duration / time.Second)
		wr.KeepWithinSeconds = &secs
	}
	wr.KeepHourly = count(spec.KeepHourly)
	wr.KeepDaily = count(spec.KeepDaily)
	wr.KeepWeekly = count(spec.KeepWeekly)
	wr.KeepMonthly = count(spec.KeepMonthly)
	wr.KeepYearly = count(spec.KeepYearly)
	wr.Timezone = spec.TimeZone
	live := int64(1)
	if spec.LiveVersions != nil {
		live = int64(*spec.LiveVersions)
	}
	// Without an expiry schedule the worker applies the rules after every backup.
	auto := spec.ExpirySchedule == ""
	wr.Live, wr.Auto = &live, &auto
	return wr
}

// count is a spec's optional count as the worker's.
func count(n *int32) *int64 {
	if n == nil {
		return nil
	}
	v := int64(*n)
	return &v
}

// policyRun is one reconcile of a RetentionPolicy: the policy as read (base, for the status patch),
// the time of this reconcile, and what the steps found and did.
type policyRun struct {
	key  types.NamespacedName
	o    *outcome
	rp   *backupv1alpha1.RetentionPolicy
	base *backupv1alpha1.RetentionPolicy
	cs   conditionSetter
	now  time.Time
	// requeue is the soonest a step wants the policy looked at again (at most the sync period).
	requeue time.Duration
	// next is when the expiry schedule fires next (zero without a schedule), and due whether it
	// is time for it now.
	next time.Time
	due  bool
	// ran: some series was slid and expired; failures and waiting name the series that failed
	// or are not placed yet.
	ran               bool
	failures, waiting []string
}

// Reconcile applies one RetentionPolicy, in these steps.
func (r *RetentionPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	var o outcome
	defer func() { o.record("retentionpolicy", err) }()
	return runSteps(ctx, &policyRun{key: req.NamespacedName, o: &o, requeue: r.SyncPeriod},
		r.load,          // read the policy, uncached
		r.checkSchedule, // Scheduled, and whether a scheduled expiry is due
		r.applyAll,      // push the rules to each series' worker; slide and expire when due
		r.recordRun,     // lastExpiryTime and nextExpiryTime
		r.report,        // Applied, and the status patch
	)
}

// load reads the policy. Slides and expiries cannot be undone, and their report (lastExpired,
// bytesReclaimed) exists only in the status this reconcile writes: it must not be lost to a write
// conflict, after which the retry would find nothing left to expire and report nothing. So the
// policy is read uncached (the cache can lag behind this controller's previous status write,
// which is what conflicted) and report writes the status with a patch, which no spec change can
// conflict with.
func (r *RetentionPolicyReconciler) load(ctx context.Context, p *policyRun) (ctrl.Result, bool, error) {
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	rp := &backupv1alpha1.RetentionPolicy{}
	if err := reader.Get(ctx, p.key, rp); err != nil {
		return stop(ctrl.Result{}, client.IgnoreNotFound(err))
	}
	if !rp.DeletionTimestamp.IsZero() {
		// Deleted, held only by someone else's finalizer: its series keep everything now
		// (their controller clears the rules), so nothing is pushed or expired any more.
		return stop(ctrl.Result{}, nil)
	}
	p.rp, p.base = rp, rp.DeepCopy()
	p.cs = conditionSetter{rec: r.Recorder, obj: rp, conds: &rp.Status.Conditions, generation: rp.Generation}
	p.now = r.Now()
	return proceed()
}

// report sets Applied from what applyAll did and patches the status when it changed. A policy
// that failed somewhere, or waits for series to be placed, is looked at again sooner.
func (r *RetentionPolicyReconciler) report(ctx context.Context, p *policyRun) (ctrl.Result, bool, error) {
	rp, st := p.rp, &p.rp.Status
	switch {
	case len(p.failures) > 0:
		p.cs.setFalse(backupv1alpha1.ConditionApplied, "WorkerError", joinMax(p.failures, 3))
		p.requeue = min(p.requeue, 30*time.Second)
	case len(p.waiting) > 0:
		p.o.waiting = true
		p.cs.waiting(backupv1alpha1.ConditionApplied, "WaitingForPlacement", "not placed yet: "+strings.Join(p.waiting, ", "))
		p.requeue = min(p.requeue, 15*time.Second)
	case len(st.Series) == 0:
		p.cs.setTrue(backupv1alpha1.ConditionApplied, "NoSeries", "no BackupSeries references this policy")
	default:
		p.cs.setTrue(backupv1alpha1.ConditionApplied, "Applied",
			fmt.Sprintf("generation %d applied to %d series", rp.Generation, len(st.Series)))
	}
	st.ObservedGeneration = rp.Generation
	if !equality.Semantic.DeepEqual(&p.base.Status, st) {
		if err := r.Status().Patch(ctx, rp, client.MergeFrom(p.base)); err != nil {
			return failed(err)
		}
	}
	return stop(ctrl.Result{RequeueAfter: p.requeue}, nil)
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
