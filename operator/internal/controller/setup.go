package controller

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/certs"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
)

// Metrics are served with authentication and authorization by the API server; leader election
// uses a Lease in the operator's namespace.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=system,resources=leases,verbs=get;list;watch;create;update;patch;delete

// FieldOwner is the server-side apply field manager of the operator.
const FieldOwner = "revault-operator"

// Index of BackupSeries by spec.retentionPolicyRef.name.
const indexRetentionRef = "spec.retentionPolicyRef.name"

// Options configure the controllers.
type Options struct {
	Config *config.Config
	// WorkerOverrides map node names to worker URLs for the operator's own calls.
	WorkerOverrides map[string]string
	// SyncPeriod is how often a BackupSeries' status is read back from its worker when nothing
	// else happens.
	SyncPeriod time.Duration
	// SeriesWait is how long a RestoreJob waits for its BackupSeries to appear before failing.
	SeriesWait time.Duration
	// PodOutput reads finished Job pods (default: termination message, then logs).
	PodOutput PodOutputReader
	// Now is the clock (tests may replace it).
	Now func() time.Time
	// VeleroDataMover runs the Velero data mover (DataUpload/DataDownload with
	// spec.datamover "revault"); it needs Velero's CRDs in the cluster.
	VeleroDataMover bool
	// CallLimits bound the calls to workers (zero: DefaultCallLimits).
	CallLimits CallLimits
	// MinFreePercent is the share of a worker's filesystems that must stay free for it to take
	// a new series (nil: plan.DefaultMinFreePercent; 0 turns the check off).
	MinFreePercent *int
}

// CacheOptions restrict the manager's caches to what the operator manages: its own namespace
// for DaemonSets, Services and Secrets, objects labelled part-of=revault for Pods, Jobs and
// CronJobs, and storage-labelled Nodes.
func CacheOptions(namespace string) cache.Options {
	ours := labels.SelectorFromSet(labels.Set{plan.LabelPartOf: plan.PartOf})
	storage, _ := labels.NewRequirement(backupv1alpha1.StorageLabel, selection.Exists, nil)
	inNS := map[string]cache.Config{namespace: {}}
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:     {Namespaces: inNS, Label: ours},
			&corev1.Service{}:    {Namespaces: inNS, Label: ours},
			&appsv1.DaemonSet{}:  {Namespaces: inNS, Label: ours},
			&appsv1.Deployment{}: {Namespaces: inNS, Label: ours},
			&corev1.Pod{}:        {Label: ours},
			&batchv1.Job{}:       {Label: ours},
			&batchv1.CronJob{}:   {Label: ours},
			&corev1.Node{}:       {Label: labels.NewSelector().Add(*storage)},
		},
	}
}

// SetupWithManager registers every controller of the operator with mgr.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if opts.SyncPeriod == 0 {
		opts.SyncPeriod = time.Minute
	}
	if opts.SeriesWait == 0 {
		opts.SeriesWait = 2 * time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	tm := &tokens.Manager{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: opts.Config.Namespace}
	if opts.CallLimits == (CallLimits{}) {
		opts.CallLimits = DefaultCallLimits
	}
	workers := &Workers{Client: mgr.GetClient(), Config: opts.Config, Tokens: tm, Overrides: opts.WorkerOverrides,
		Limits: opts.CallLimits, Health: NewWorkerHealth()}
	if t := opts.Config.TLS; t != nil {
		workers.Certs = &certs.Manager{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: opts.Config.Namespace,
			Names:    certs.ServingNames(opts.Config.Namespace, t.ClusterDomain),
			Life:     certs.Lifetimes{CA: t.CAValidity.Duration, Serving: t.CertValidity.Duration},
			Provided: t.Secret,
			Now:      opts.Now,
			Cache:    mgr.GetCache(),
		}
		if err := mgr.Add(workers.Certs); err != nil {
			return err
		}
	}
	if opts.PodOutput == nil {
		opts.PodOutput = NewPodOutputReader(nil)
	}
	minFree := plan.DefaultMinFreePercent
	if opts.MinFreePercent != nil {
		minFree = *opts.MinFreePercent
	}

	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &backupv1alpha1.BackupSeries{}, indexRetentionRef,
		func(o client.Object) []string {
			bs := o.(*backupv1alpha1.BackupSeries)
			if bs.Spec.RetentionPolicyRef == nil {
				return nil
			}
			return []string{bs.Spec.RetentionPolicyRef.Name}
		}); err != nil {
		return err
	}

	if err := (&WorkerPoolReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Config: opts.Config, Tokens: tm,
		Recorder: mgr.GetEventRecorderFor("workerpool-controller"), Now: opts.Now,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&BackupSeriesReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Config: opts.Config,
		Recorder: mgr.GetEventRecorderFor("backupseries-controller"), Tokens: tm, Workers: workers, PodOutput: opts.PodOutput,
		SyncPeriod: opts.SyncPeriod, Phases: metrics.NewPhaseTracker(), Now: opts.Now, MinFreePercent: minFree,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&RetentionPolicyReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("retentionpolicy-controller"),
		Workers: workers, SyncPeriod: opts.SyncPeriod, Now: opts.Now,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&RestoreJobReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorderFor("restorejob-controller"),
		Config: opts.Config, Tokens: tm, Workers: workers, PodOutput: opts.PodOutput,
		SeriesWait: opts.SeriesWait, Now: opts.Now,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if !opts.VeleroDataMover {
		return nil
	}
	if err := (&DataUploadReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("velero-datamover"),
		Config: opts.Config, Workers: workers, PodOutput: opts.PodOutput, Now: opts.Now,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&DataDownloadReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("velero-datamover"),
		Workers: workers, Now: opts.Now,
	}).SetupWithManager(mgr)
}

// apply writes obj with server-side apply as the operator's field manager: only the fields the
// operator sets are owned, defaults and other writers' fields are left alone, and an unchanged
// object costs no write.
func apply(ctx context.Context, c client.Client, scheme *runtime.Scheme, obj client.Object) error {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	return c.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership)
}
