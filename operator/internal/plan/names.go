// Package plan holds the operator's decisions as pure functions: object names, which worker a
// series goes to, what retention removes, which version a restore means, and the objects
// (DaemonSets, Services, CronJobs, Jobs) the controllers create. Controllers only fetch state,
// call these, and write the result, so every decision here is table-tested.
package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// Labels every object the operator creates carries; the operator's caches only see objects
// with LabelPartOf=PartOf.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelPartOf    = "app.kubernetes.io/part-of"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelComponent = "app.kubernetes.io/component"
	LabelInstance  = "app.kubernetes.io/instance"

	// LabelPool is the media of a worker pool (ssd, hdd) on its DaemonSet, pods and Services.
	LabelPool = "revault.io/pool"
	// LabelNode is set by the operator on each worker pod: the node it runs on (as a label
	// value), so each node's Service selects exactly that node's worker.
	LabelNode = "revault.io/node"
	// LabelSeries marks backup Jobs and CronJobs with their BackupSeries (as a label value).
	LabelSeries = "revault.io/series"
	// LabelRestore marks restore Jobs with their RestoreJob (as a label value).
	LabelRestore = "revault.io/restore"
	// LabelToken marks the token Secrets the operator writes.
	LabelToken = "revault.io/token"
	// LabelAdopted marks the Deployment (and pod) serving the store of a lost node, rebuilt
	// from the remote on another node of the pool.
	LabelAdopted = "revault.io/adopted"

	// AnnotationSeries holds the full BackupSeries name on Jobs (label values are capped at 63).
	AnnotationSeries = "revault.io/series"
	// AnnotationVersion holds the version number a restore Job restores.
	AnnotationVersion = "revault.io/version"
	// AnnotationNode holds the full node name on worker Services, and on an adopted store's
	// pod the node whose store it serves.
	AnnotationNode = "revault.io/node"
	// AnnotationHost holds, on an adopted store's Deployment, the node that rebuilt the store
	// and keeps it: the pod is pinned there.
	AnnotationHost = "revault.io/host"
	// AnnotationMoveTo holds, on a move Job, the MEDIA/NODE it copies the series to.
	AnnotationMoveTo = "revault.io/move-to"

	PartOf    = "revault"
	ManagedBy = "revault-operator"

	ComponentWorker  = "worker"
	ComponentBackup  = "backup"
	ComponentRestore = "restore"
	// ComponentMove: the Job that copies a series to another worker.
	ComponentMove = "move"
)

// Names of the operator's fixed objects.
const (
	// WorkerPrefix names the worker DaemonSets (revault-worker-ssd) and Services.
	WorkerPrefix = "revault-worker"
	// WorkerTokensSecret (operator namespace) holds the workers' token file under key "tokens".
	WorkerTokensSecret = "revault-worker-tokens"
	WorkerTokensKey    = "tokens"
	// WorkerQuotasKey (same Secret) holds the workers' quota file (revault serve --quota-file).
	WorkerQuotasKey = "quotas"
	// NamespaceTokenSecret is the Secret in each user namespace that Job pods mount; its key
	// "token" holds a token scoped to that namespace.
	NamespaceTokenSecret = "revault-token"
	NamespaceTokenKey    = "token"
	// CASecret (operator namespace) holds the CA that signs the workers' certificate; only
	// the operator reads it.
	CASecret = "revault-ca"
	// WorkerTLSSecret (operator namespace) holds the workers' certificate, key and the CA
	// bundle (tls.crt, tls.key, ca.crt).
	WorkerTLSSecret = "revault-worker-tls"
	// CAConfigMap is the ConfigMap in each user namespace whose key "ca.crt" is the CA bundle
	// its Job pods trust.
	CAConfigMap = "revault-ca"
	CAKey       = "ca.crt"
)

// Limits on object names: Job and Service names become label values (63); the CronJob
// controller appends 11 characters to a CronJob's name for its Jobs (52).
const (
	maxLabel   = 63
	maxCronJob = 52
)

// Hash8 is a short, stable digest of s for names.
func Hash8(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:8]
}

// fitName joins base and suffix within max characters; when base must be shortened, a digest of
// the full base keeps the result unique.
func fitName(base, suffix string, max int) string {
	if len(base)+len(suffix) <= max {
		return base + suffix
	}
	keep := max - len(suffix) - 9 // "-" + 8 hex digits
	if keep < 1 {
		keep = 1
	}
	short := strings.TrimRight(base[:keep], "-.")
	return short + "-" + Hash8(base) + suffix
}

var labelValueRE = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

// LabelValue maps any name to a valid label value: the name itself when it is one, otherwise a
// readable prefix and a digest.
func LabelValue(s string) string {
	if len(s) <= maxLabel && labelValueRE.MatchString(s) {
		return s
	}
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '-'
	}, s)
	if len(clean) > maxLabel-9 {
		clean = clean[:maxLabel-9]
	}
	clean = strings.Trim(clean, "-._")
	if clean == "" {
		return Hash8(s)
	}
	return clean + "-" + Hash8(s)
}

// dnsLabel lowercases s and replaces what a DNS label cannot hold.
func dnsLabel(s string) string {
	s = strings.ToLower(s)
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
	return strings.Trim(s, "-")
}

// DaemonSetName is the worker DaemonSet of a pool: revault-worker-ssd.
func DaemonSetName(media string) string { return WorkerPrefix + "-" + media }

// WorkerServiceName is the per-node Service of a pool's worker: revault-worker-ssd-<node>, with a
// digest when the node name does not fit a DNS label.
func WorkerServiceName(media, node string) string {
	prefix := WorkerPrefix + "-" + media + "-"
	n := dnsLabel(node)
	if n == node && len(prefix)+len(n) <= maxLabel {
		return prefix + n
	}
	// Cleaned or too long: a readable part and a digest of the real node name.
	if keep := maxLabel - len(prefix) - 9; len(n) > keep {
		n = strings.TrimRight(n[:keep], "-")
	}
	return prefix + n + "-" + Hash8(node)
}

// AdoptedStoreName is the Deployment serving the store of lost node `node` in pool `media`:
// revault-store-ssd-<node>, with a digest when the node name does not fit.
func AdoptedStoreName(media, node string) string {
	return fitName("revault-store-"+media+"-"+dnsLabel(node), "", maxCronJob)
}

// WorkerEndpoint is the in-cluster URL of a worker Service.
func WorkerEndpoint(service, namespace string, port int32, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	return scheme + service + "." + namespace + ".svc:" + itoa(int64(port))
}

// CronJobName is the CronJob of a series' schedule.
func CronJobName(series string) string { return fitName(series, "-backup", maxCronJob) }

// BackupNowJobName is the Job for one value of the backup-now annotation.
func BackupNowJobName(series, request string) string {
	return fitName(series, "-now-"+Hash8(request), maxLabel)
}

// MoveJobName is the Job that moves a series to the worker at dest (MEDIA/NODE).
func MoveJobName(series, dest string) string {
	return fitName(series, "-move-"+Hash8(dest), maxLabel)
}

// RestoreJobName is the Job of a RestoreJob.
func RestoreJobName(restore string) string { return fitName(restore, "-restore", maxLabel) }

// SeriesID is the worker's name for a series: namespace/name.
func SeriesID(namespace, name string) string { return namespace + "/" + name }
