// Package metrics registers the operator's own metrics with controller-runtime's registry, so
// they are served on the manager's metrics endpoint next to controller-runtime's.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// ReconcileOutcomes counts reconciles by controller and outcome: success, requeue (waiting
	// on something, e.g. no worker yet), worker_error (the worker refused or was unreachable),
	// api_error (the Kubernetes API failed).
	ReconcileOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "revault_operator_reconcile_outcomes_total",
		Help: "Reconciles by controller and outcome (success, requeue, worker_error, api_error).",
	}, []string{"controller", "outcome"})

	// SeriesByPhase is the number of BackupSeries in each phase.
	SeriesByPhase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "revault_operator_backupseries",
		Help: "BackupSeries by phase (Pending, Ready, Queued, BackingUp, Failed, Deleting).",
	}, []string{"phase"})

	// BackupJobs counts finished backup Jobs by result.
	BackupJobs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "revault_operator_backup_jobs_total",
		Help: "Finished backup Jobs by result (succeeded, failed).",
	}, []string{"result"})

	// Restores counts finished RestoreJobs by result.
	Restores = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "revault_operator_restores_total",
		Help: "Finished RestoreJobs by result (succeeded, failed).",
	}, []string{"result"})

	// WorkerRequests counts the operator's calls to workers by operation and outcome.
	WorkerRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "revault_operator_worker_requests_total",
		Help: "Operator calls to worker APIs by operation and outcome (ok, error; skipped: not made, the worker did not answer in time a moment ago).",
	}, []string{"operation", "outcome"})

	// TLSFailing is 1 while the operator cannot keep the workers' certificates (its last
	// attempt failed), 0 once it can: the signal to alert on, since nothing else shows a CA
	// that cannot be renewed until certificates expire.
	TLSFailing = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "revault_operator_worker_tls_failing",
		Help: "1 while the operator's last attempt to issue or renew the workers' TLS certificates failed (see its log), else 0.",
	})

	// BytesReclaimed counts bytes freed by the slides and expiries the operator ran.
	BytesReclaimed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "revault_operator_retention_bytes_reclaimed_total",
		Help: "Bytes freed on workers by slides and expiries the operator ran.",
	})
)

// Phases are the BackupSeries phases, so every phase has a gauge (zero when empty).
var Phases = []string{"Pending", "Ready", "Queued", "BackingUp", "Failed", "Deleting"}

func init() {
	crmetrics.Registry.MustRegister(ReconcileOutcomes, SeriesByPhase, BackupJobs, Restores, WorkerRequests, BytesReclaimed, TLSFailing)
	for _, p := range Phases {
		SeriesByPhase.WithLabelValues(p).Set(0)
	}
}

// PhaseTracker keeps each series' phase so the SeriesByPhase gauges are exact.
type PhaseTracker struct {
	mu     sync.Mutex
	phases map[string]string
}

// NewPhaseTracker returns an empty tracker.
func NewPhaseTracker() *PhaseTracker { return &PhaseTracker{phases: map[string]string{}} }

// Set records key's phase ("" forgets key) and updates the gauges.
func (t *PhaseTracker) Set(key, phase string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.phases[key]
	if had && old == phase {
		return
	}
	if had {
		SeriesByPhase.WithLabelValues(old).Dec()
		delete(t.phases, key)
	}
	if phase != "" {
		t.phases[key] = phase
		SeriesByPhase.WithLabelValues(phase).Inc()
	}
}
