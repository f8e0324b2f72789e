// Command manager is the Revault operator: it reconciles BackupSeries, RetentionPolicy and
// RestoreJob objects and runs the worker pools.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"
	// The image has no zoneinfo: schedules' time zones come from the binary's own copy.
	_ "time/tzdata"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/controller"
	"github.com/revault-io/revault/operator/internal/plan"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(backupv1alpha1.AddToScheme(scheme))
	utilruntime.Must(velerov1.AddToScheme(scheme))
	utilruntime.Must(velerov2alpha1.AddToScheme(scheme))
	utilruntime.Must(snapshotv1.AddToScheme(scheme))
}

// flags are the command line's settings.
type flags struct {
	metricsAddr, probeAddr, configPath, namespace, overrides string
	secureMetrics, enableHTTP2, leaderElect, readLogs        bool
	veleroDataMover                                          bool
	syncPeriod, seriesWait                                   time.Duration
	maxConcurrent, minFreePercent                            int
	calls                                                    controller.CallLimits
}

func main() {
	var f flags
	flag.StringVar(&f.metricsAddr, "metrics-bind-address", ":8443",
		"Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP with --metrics-secure=false, 0 to disable).")
	flag.BoolVar(&f.secureMetrics, "metrics-secure", true,
		"Serve metrics over HTTPS, allowing only callers authorized by the API server (TokenReview/SubjectAccessReview).")
	flag.BoolVar(&f.enableHTTP2, "enable-http2", false, "Allow HTTP/2 on the metrics server (off: CVE-2023-44487/39325).")
	flag.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.BoolVar(&f.leaderElect, "leader-elect", false, "Elect a leader, so only one of several replicas reconciles.")
	flag.StringVar(&f.configPath, "config", "/etc/revault-operator/config.yaml", "Operator configuration file (worker pools, Jobs).")
	flag.StringVar(&f.namespace, "namespace", os.Getenv("POD_NAMESPACE"),
		"Namespace of the workers and their token Secret (default: $POD_NAMESPACE).")
	flag.StringVar(&f.overrides, "worker-endpoints", os.Getenv("REVAULT_WORKER_ENDPOINTS"),
		"NODE=URL,... : reach the worker of NODE at URL instead of its Service (for running outside the cluster).")
	flag.DurationVar(&f.syncPeriod, "sync-period", time.Minute, "How often a series' status is read back from its worker.")
	flag.DurationVar(&f.seriesWait, "restore-series-wait", 2*time.Minute,
		"How long a RestoreJob waits for its BackupSeries to exist before it fails.")
	flag.BoolVar(&f.readLogs, "read-pod-logs", true,
		"Read a finished Job pod's log for its report when its termination message has none.")
	flag.BoolVar(&f.veleroDataMover, "velero-data-mover", false,
		"Serve Velero DataUploads/DataDownloads whose spec.datamover is \"revault\" (needs Velero's CRDs).")
	flag.IntVar(&f.maxConcurrent, "max-concurrent-reconciles", 4,
		"Objects of one kind reconciled at once (each may wait on a worker).")
	flag.DurationVar(&f.calls.Quick, "worker-timeout", controller.DefaultCallLimits.Quick,
		"Bound of a worker call that reads or stores little (status, retention).")
	flag.DurationVar(&f.calls.Heavy, "worker-heavy-timeout", controller.DefaultCallLimits.Heavy,
		"Bound of a worker call whose work grows with the series (slide, expire, delete).")
	flag.DurationVar(&f.calls.Pause, "worker-pause", controller.DefaultCallLimits.Pause,
		"How long a worker that did not answer in time is not called again (its calls fail at once).")
	flag.IntVar(&f.minFreePercent, "min-free-percent", plan.DefaultMinFreePercent,
		"Share of a worker's container or metadata filesystem that must stay free for it to take a new series (0: no check).")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	if err := run(f); err != nil {
		setupLog.Error(err, "operator stopped")
		os.Exit(1)
	}
}

func run(f flags) error {
	if f.maxConcurrent < 1 {
		return fmt.Errorf("--max-concurrent-reconciles must be at least 1, not %d", f.maxConcurrent)
	}
	if f.minFreePercent < 0 || f.minFreePercent > 100 {
		return fmt.Errorf("--min-free-percent must be 0 to 100, not %d", f.minFreePercent)
	}
	if f.calls.Quick <= 0 || f.calls.Heavy <= 0 || f.calls.Pause < 0 {
		return fmt.Errorf("--worker-timeout and --worker-heavy-timeout must be positive, --worker-pause not negative")
	}
	cfg, err := config.Load(f.configPath)
	if err != nil {
		return err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = f.namespace
	}
	if cfg.Namespace == "" {
		return fmt.Errorf("no namespace: set --namespace, $POD_NAMESPACE or namespace in %s", f.configPath)
	}
	ovr, err := controller.ParseOverrides(f.overrides, cfg.TLSOn())
	if err != nil {
		return err
	}

	var tlsOpts []func(*tls.Config)
	if !f.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{BindAddress: f.metricsAddr, SecureServing: f.secureMetrics, TLSOpts: tlsOpts}
	if f.secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	restCfg := ctrl.GetConfigOrDie()
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        f.probeAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "revault-operator.backup.revault.io",
		LeaderElectionNamespace:       cfg.Namespace,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controller.CacheOptions(cfg.Namespace),
		Controller:                    ctrlconfig.Controller{MaxConcurrentReconciles: f.maxConcurrent},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	var reader controller.PodOutputReader
	if f.readLogs {
		cs, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return err
		}
		reader = controller.NewPodOutputReader(cs)
	}
	if err := controller.SetupWithManager(mgr, controller.Options{
		Config: cfg, WorkerOverrides: ovr, SyncPeriod: f.syncPeriod, SeriesWait: f.seriesWait, PodOutput: reader,
		VeleroDataMover: f.veleroDataMover, CallLimits: f.calls, MinFreePercent: &f.minFreePercent,
	}); err != nil {
		return fmt.Errorf("setting up the controllers: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	setupLog.Info("starting the operator", "namespace", cfg.Namespace, "pools", len(cfg.Pools), "workerImage", cfg.Worker.Image)
	return mgr.Start(ctrl.SetupSignalHandler())
}
