package plan

import (
	"path"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
)

// Paths inside worker and Job containers.
const (
	WorkerStoreDir  = "/var/lib/revault"
	WorkerTokensDir = "/etc/revault/tokens"
	JobTokenDir     = "/etc/revault"
	JobTokenFile    = JobTokenDir + "/" + NamespaceTokenKey
	JobCAFile       = JobTokenDir + "/" + CAKey
	JobDataDir      = "/data"
	WorkerTLSDir    = "/etc/revault/tls"
)

func commonLabels(component string) map[string]string {
	return map[string]string{
		LabelName:      PartOf,
		LabelPartOf:    PartOf,
		LabelManagedBy: ManagedBy,
		LabelComponent: component,
	}
}

// WorkerSelector selects a pool's worker pods.
func WorkerSelector(media string) map[string]string {
	return map[string]string{LabelName: PartOf, LabelComponent: ComponentWorker, LabelPool: media}
}

// WorkerLabels are the labels of a pool's DaemonSet and pods.
func WorkerLabels(media string) map[string]string {
	l := commonLabels(ComponentWorker)
	l[LabelPool] = media
	return l
}

// restricted is the container security context every pod starts from: no privilege escalation,
// no capabilities, read-only root, the runtime's seccomp profile.
func restricted(uid int64, addCaps ...corev1.Capability) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		RunAsUser:                ptr.To(uid),
		RunAsNonRoot:             ptr.To(uid != 0),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if len(addCaps) > 0 {
		sc.Capabilities.Add = addCaps
	}
	return sc
}

func tmpVolume() (corev1.Volume, corev1.VolumeMount) {
	return corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}
}

// WorkerDaemonSet is a pool's DaemonSet: `revault serve` on every node labelled
// revault.io/storage=<media>, its store in <hostPath>/<media> on the node.
//
// The worker runs as root (UID 0) with every capability dropped: a hostPath directory is
// created by the kubelet as root:root 0755 and fsGroup does not apply to hostPath volumes, so
// only its owner can write there; owning it needs no capability. Root filesystem read-only.
func WorkerDaemonSet(cfg *config.Config, pool config.PoolConfig) *appsv1.DaemonSet {
	media := string(pool.Media)
	nodeSelector := map[string]string{}
	for k, v := range pool.NodeSelector {
		nodeSelector[k] = v
	}
	nodeSelector[backupv1alpha1.StorageLabel] = media
	// Each node's store has its own place in the bucket, named after the node.
	remoteURL := ""
	if cfg.Remote != nil {
		remoteURL = cfg.Remote.StoreURL(media, "$(NODE_NAME)")
	}
	spec := workerPodSpec(cfg, pool, path.Join(cfg.Worker.HostPath, media), remoteURL, false)
	spec.NodeSelector = nodeSelector
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:      DaemonSetName(media),
			Namespace: cfg.Namespace,
			Labels:    WorkerLabels(media),
		},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: WorkerSelector(media)},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{
					MaxUnavailable: ptr.To(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: WorkerLabels(media)},
				Spec:       spec,
			},
		},
	}
}

// AdoptedStore is the Deployment that serves the store of node `node` of a pool after the
// node was lost: one pod on another node of the pool, which rebuilds the store from the
// remote into <hostPath>/adopted/<media>-<node> (`revault serve --init --recover`) and then
// serves it. It carries the lost node's revault.io/node label, so the node's Service — the
// endpoint every series placed there records — reaches it. It runs only on host, the node
// chosen to keep the rebuilt store: a pod replaced (evicted, drained, deleted) comes back to
// the same directory, where the store's lock keeps two pods from serving it at once. Were it
// free to land on another node, the replacement would rebuild the store from the bucket again
// and fence out the pod before it, whose last acknowledged backups may not have been uploaded.
// It never runs on the lost node (which, if it comes back, holds a stale copy that the store's
// new generation fences out).
func AdoptedStore(cfg *config.Config, pool config.PoolConfig, node, host string) *appsv1.Deployment {
	media := string(pool.Media)
	labels := WorkerLabels(media)
	labels[LabelNode] = LabelValue(node)
	labels[LabelAdopted] = "true"
	dir := path.Join(cfg.Worker.HostPath, "adopted", media+"-"+LabelValue(node))
	spec := workerPodSpec(cfg, pool, dir, cfg.Remote.StoreURL(media, node), true)
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: nodeSelectorExpressions(pool),
				MatchFields: []corev1.NodeSelectorRequirement{{
					Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{host},
				}},
			}},
		},
	}}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name:        AdoptedStoreName(media, node),
			Namespace:   cfg.Namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationNode: node, AnnotationHost: host},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// Never two pods of one store at once.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationNode: node}},
				Spec:       spec,
			},
		},
	}
}

// nodeSelectorExpressions is a pool's node selector (its own plus the storage label) as
// required node-affinity expressions.
func nodeSelectorExpressions(pool config.PoolConfig) []corev1.NodeSelectorRequirement {
	sel := map[string]string{backupv1alpha1.StorageLabel: string(pool.Media)}
	for k, v := range pool.NodeSelector {
		sel[k] = v
	}
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]corev1.NodeSelectorRequirement, 0, len(keys))
	for _, k := range keys {
		out = append(out, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{sel[k]}})
	}
	return out
}

// workerPodSpec is the pod of a worker: `revault serve` over the store at storePath on the
// node, with its remote at remoteURL when the operator has one configured. An adopted store's
// worker (adopt) keeps its store one level down, so that a copy another rebuild superseded can
// be moved aside inside the volume.
func workerPodSpec(cfg *config.Config, pool config.PoolConfig, storePath, remoteURL string, adopt bool) corev1.PodSpec {
	port := cfg.Worker.Port
	store := WorkerStoreDir
	if adopt {
		store = WorkerStoreDir + "/store"
	}
	args := []string{"serve",
		"--store", store,
		"--init",
		"--listen", "0.0.0.0:" + strconv.Itoa(int(port)),
		"--token-file", path.Join(WorkerTokensDir, WorkerTokensKey),
		"--quota-file", path.Join(WorkerTokensDir, WorkerQuotasKey),
		// On SIGTERM keep answering (with /readyz failing: 503 shutting_down) while the
		// Service drops the pod, then let in-flight backups finish within the pod's grace
		// period.
		"--shutdown-delay", "5s",
		"--grace-period", "100s",
	}
	if cfg.Worker.LogFormat != "" {
		args = append(args, "--log-format", cfg.Worker.LogFormat)
	}
	if cfg.Worker.DedupDomain != "" {
		args = append(args, "--dedup-domain", cfg.Worker.DedupDomain)
	}
	scheme := corev1.URISchemeHTTP
	if cfg.TLSOn() {
		scheme = corev1.URISchemeHTTPS
		args = append(args, "--tls-cert", WorkerTLSDir+"/"+corev1.TLSCertKey, "--tls-key", WorkerTLSDir+"/"+corev1.TLSPrivateKeyKey)
	}
	tmpVol, tmpMount := tmpVolume()
	probe := func(p string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: p, Port: intstr.FromString("http"), Scheme: scheme}},
			PeriodSeconds:    period,
			TimeoutSeconds:   5,
			FailureThreshold: 3,
		}
	}
	mounts := []corev1.VolumeMount{
		{Name: "store", MountPath: WorkerStoreDir},
		{Name: "tokens", MountPath: WorkerTokensDir, ReadOnly: true},
		tmpMount,
	}
	volumes := []corev1.Volume{
		{Name: "store", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: storePath,
			Type: ptr.To(corev1.HostPathDirectoryOrCreate),
		}}},
		{Name: "tokens", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  WorkerTokensSecret,
			DefaultMode: ptr.To(int32(0o400)),
		}}},
		tmpVol,
	}
	if cfg.TLSOn() {
		// The kubelet swaps a renewed certificate into the volume; the worker reads it again.
		mounts = append(mounts, corev1.VolumeMount{Name: "tls", MountPath: WorkerTLSDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  WorkerTLSSecretName(cfg),
			Items:       []corev1.KeyToPath{{Key: corev1.TLSCertKey, Path: corev1.TLSCertKey}, {Key: corev1.TLSPrivateKeyKey, Path: corev1.TLSPrivateKeyKey}},
			DefaultMode: ptr.To(int32(0o400)),
		}}})
	}
	env := append([]corev1.EnvVar{}, cfg.Worker.Env...)
	// A worker that reopens its store after it was rebuilt elsewhere has the time to finish
	// its last upload within the grace period too.
	grace := int64(120)
	if r := cfg.Remote; r != nil && remoteURL != "" {
		args = append(args, "--recover",
			"--sync-interval", r.SyncInterval.Duration.String(),
			"--evict-after", r.EvictAfter.Duration.String())
		if adopt {
			args = append(args, "--adopt")
		}
		env = append(env, remoteEnv(r, remoteURL)...)
		mounts = append(mounts, corev1.VolumeMount{Name: "remote-key", MountPath: WorkerRemoteKeyDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "remote-key", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  r.KeySecret,
			Items:       []corev1.KeyToPath{{Key: config.RemoteKeySecretKey, Path: config.RemoteKeySecretKey}},
			DefaultMode: ptr.To(int32(0o400)),
		}}})
		grace = 150
	}
	return corev1.PodSpec{
		Tolerations:                   pool.Tolerations,
		PriorityClassName:             cfg.Worker.PriorityClassName,
		ImagePullSecrets:              cfg.Worker.ImagePullSecrets,
		AutomountServiceAccountToken:  ptr.To(false),
		EnableServiceLinks:            ptr.To(false),
		TerminationGracePeriodSeconds: ptr.To(grace),
		SecurityContext: &corev1.PodSecurityContext{
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name:            "revault",
			Image:           cfg.Worker.Image,
			ImagePullPolicy: cfg.Worker.ImagePullPolicy,
			Command:         cfg.Worker.Command,
			Args:            args,
			Env:             env,
			Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
			Resources:       pool.Resources,
			// A store degraded by a full disk takes no new work but serves restores, of
			// versions it may hold alone: it stays ready (in its Service), and its stats tell
			// the operator to place no new series there.
			ReadinessProbe:           probe("/readyz?exclude=writes", 5),
			LivenessProbe:            probe("/healthz", 10),
			SecurityContext:          restricted(0),
			VolumeMounts:             mounts,
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		}},
		Volumes: volumes,
	}
}

// WorkerRemoteKeyDir is where workers mount the remote's key file.
const WorkerRemoteKeyDir = "/etc/revault/remote-key"

// remoteEnv is how a worker reaches its remote: the store's URL, the key file, the S3
// credentials (from the credentials Secret), endpoint and region. NODE_NAME comes first so
// that a URL naming $(NODE_NAME) expands to the pod's node.
func remoteEnv(r *config.RemoteConfig, url string) []corev1.EnvVar {
	env := []corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "REVAULT_REMOTE", Value: url},
		{Name: "REVAULT_KEY_FILE", Value: WorkerRemoteKeyDir + "/" + config.RemoteKeySecretKey},
	}
	if r.CredentialsSecret != "" {
		for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
			env = append(env, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: r.CredentialsSecret}, Key: k,
			}}})
		}
	}
	if r.Endpoint != "" {
		env = append(env, corev1.EnvVar{Name: "AWS_ENDPOINT_URL", Value: r.Endpoint})
	}
	if r.Region != "" {
		env = append(env, corev1.EnvVar{Name: "AWS_REGION", Value: r.Region})
	}
	if r.ObjectLockDays > 0 {
		env = append(env, corev1.EnvVar{Name: "REVAULT_OBJECT_LOCK_DAYS", Value: strconv.Itoa(int(r.ObjectLockDays))})
	}
	return env
}

// WorkerService is the Service of one node's worker in a pool. The operator labels each worker
// pod with revault.io/node, so the Service selects exactly the pod on that node, and the Service
// name stays the same when the pod is replaced.
func WorkerService(cfg *config.Config, media, node string) *corev1.Service {
	sel := WorkerSelector(media)
	sel[LabelNode] = LabelValue(node)
	labels := WorkerLabels(media)
	labels[LabelNode] = LabelValue(node)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:        WorkerServiceName(media, node),
			Namespace:   cfg.Namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationNode: node},
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: sel,
			Ports: []corev1.ServicePort{{
				Name: "http", Port: cfg.Worker.Port, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP,
			}},
			// Only a ready worker receives traffic. Its readiness probe leaves out whether it
			// takes writes (/readyz?exclude=writes), so a worker with a full disk stays in.
			// Publishing not-ready addresses instead would route to a worker on a lost node
			// (its DaemonSet pod stays, not ready) beside the store adopted from it.
			PublishNotReadyAddresses: false,
		},
	}
}

// jobPodSpec is the pod of a backup or restore Job: one container running revault with the
// namespace token mounted, the volume at /data, a writable /tmp and nothing else writable.
// Job pods run as root: a backup must read every file whatever its owner and mode
// (CAP_DAC_READ_SEARCH, nothing else), a restore must recreate owners, modes and device nodes.
func jobPodSpec(cfg *config.Config, labels map[string]string, args []string, vol corev1.VolumeSource,
	readOnly bool, caps []corev1.Capability) corev1.PodTemplateSpec {
	tmpVol, tmpMount := tmpVolume()
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			PriorityClassName:            cfg.Jobs.PriorityClassName,
			ImagePullSecrets:             cfg.Jobs.ImagePullSecrets,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "revault",
				Image:           cfg.Jobs.Image,
				ImagePullPolicy: cfg.Jobs.ImagePullPolicy,
				Command:         cfg.Worker.Command,
				Args:            args,
				Resources:       cfg.Jobs.Resources,
				SecurityContext: restricted(0, caps...),
				VolumeMounts: []corev1.VolumeMount{
					{Name: "data", MountPath: JobDataDir, ReadOnly: readOnly},
					{Name: "token", MountPath: JobTokenDir, ReadOnly: true},
					tmpMount,
				},
				// The report is read from the termination message when the image writes one,
				// otherwise from the log; on failure the kubelet copies the log's tail here.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: vol},
				{Name: "token", VolumeSource: jobTokenVolume(cfg)},
				tmpVol,
			},
		},
	}
}

// jobTokenVolume is what Job pods mount at JobTokenDir: the namespace's token, and with TLS the
// CA bundle that its worker's certificate chains to.
func jobTokenVolume(cfg *config.Config) corev1.VolumeSource {
	if !cfg.TLSOn() {
		return corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  NamespaceTokenSecret,
			DefaultMode: ptr.To(int32(0o400)),
		}}
	}
	return corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To(int32(0o400)),
		Sources: []corev1.VolumeProjection{
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: NamespaceTokenSecret}}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: CAConfigMap},
				Items: []corev1.KeyToPath{{Key: CAKey, Path: CAKey}}}},
		},
	}}
}

// WorkerTLSSecretName is the Secret holding the workers' certificate.
func WorkerTLSSecretName(cfg *config.Config) string {
	if cfg.TLS != nil && cfg.TLS.Secret != "" {
		return cfg.TLS.Secret
	}
	return WorkerTLSSecret
}

// JobEndpoint is endpoint with the scheme the workers serve now: a series placed before TLS was
// turned on (or off) keeps its recorded URL, and its Jobs must still reach the worker.
func JobEndpoint(cfg *config.Config, endpoint string) string {
	rest, ok := strings.CutPrefix(endpoint, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(endpoint, "https://")
	}
	if !ok {
		return endpoint
	}
	if cfg.TLSOn() {
		return "https://" + rest
	}
	return "http://" + rest
}

// clientArgs are how a Job's revault reaches and trusts its worker.
func clientArgs(cfg *config.Config, endpoint string) []string {
	args := []string{"--server", JobEndpoint(cfg, endpoint), "--token-file", JobTokenFile}
	if cfg.TLSOn() {
		args = append(args, "--ca-cert", JobCAFile)
	}
	return args
}

// BackupArgs are the arguments of a backup pod: push /data to the series' worker.
func BackupArgs(cfg *config.Config, bs *backupv1alpha1.BackupSeries, endpoint string) []string {
	args := append([]string{"--json", "--quiet", "push"}, clientArgs(cfg, endpoint)...)
	args = append(args, "--series", SeriesID(bs.Namespace, bs.Name))
	if bs.Spec.Dedup.Unit != "" {
		args = append(args, "--unit", string(bs.Spec.Dedup.Unit))
	}
	return append(args, JobDataDir)
}

// BackupLabels are the labels of a series' backup Jobs, CronJob and pods.
func BackupLabels(series string) map[string]string {
	l := commonLabels(ComponentBackup)
	l[LabelSeries] = LabelValue(series)
	return l
}

// BackupJobSpec is the spec of one backup Job (also the CronJob's Job template).
func BackupJobSpec(cfg *config.Config, bs *backupv1alpha1.BackupSeries, endpoint string) batchv1.JobSpec {
	claim := ""
	if bs.Spec.Source.PVC != nil {
		claim = bs.Spec.Source.PVC.ClaimName
	}
	spec := batchv1.JobSpec{
		BackoffLimit: cfg.Jobs.BackoffLimit,
		Template: jobPodSpec(cfg, BackupLabels(bs.Name), BackupArgs(cfg, bs, endpoint),
			corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}},
			true, []corev1.Capability{"DAC_READ_SEARCH"}),
	}
	if cfg.Jobs.ActiveDeadlineSeconds > 0 {
		spec.ActiveDeadlineSeconds = ptr.To(cfg.Jobs.ActiveDeadlineSeconds)
	}
	return spec
}

// BackupCronJob runs a series' scheduled backups. Forbid: one backup of a series at a time
// (the worker refuses a second writer anyway).
func BackupCronJob(cfg *config.Config, bs *backupv1alpha1.BackupSeries, endpoint string) *batchv1.CronJob {
	labels := BackupLabels(bs.Name)
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{
			Name:        CronJobName(bs.Name),
			Namespace:   bs.Namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationSeries: bs.Name},
		},
		Spec: batchv1.CronJobSpec{
			Schedule:                   bs.Spec.Schedule,
			TimeZone:                   bs.Spec.TimeZone,
			Suspend:                    ptr.To(bs.Spec.Suspend),
			ConcurrencyPolicy:          batchv1.ForbidConcurrent,
			StartingDeadlineSeconds:    ptr.To(int64(3600)),
			SuccessfulJobsHistoryLimit: ptr.To(int32(3)),
			FailedJobsHistoryLimit:     ptr.To(int32(3)),
			JobTemplate: batchv1.JobTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationSeries: bs.Name}},
				Spec:       BackupJobSpec(cfg, bs, endpoint),
			},
		},
	}
}

// BackupNowJob is the Job for one value of the revault.io/backup-now annotation.
func BackupNowJob(cfg *config.Config, bs *backupv1alpha1.BackupSeries, endpoint, request string) *batchv1.Job {
	spec := BackupJobSpec(cfg, bs, endpoint)
	spec.TTLSecondsAfterFinished = cfg.Jobs.TTLSecondsAfterFinished
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:      BackupNowJobName(bs.Name, request),
			Namespace: bs.Namespace,
			Labels:    BackupLabels(bs.Name),
			Annotations: map[string]string{
				AnnotationSeries:                   bs.Name,
				backupv1alpha1.BackupNowAnnotation: request,
			},
		},
		Spec: spec,
	}
}

// RestoreArgs are the arguments of a restore pod: pull one version into /data/.
func RestoreArgs(cfg *config.Config, rj *backupv1alpha1.RestoreJob, endpoint string, version int64) []string {
	policy := string(rj.Spec.Cache.Policy)
	if policy == "" {
		policy = "auto"
	}
	budget := int64(64 << 20)
	if rj.Spec.Cache.MemoryBudget != nil {
		budget = rj.Spec.Cache.MemoryBudget.Value()
	}
	args := append([]string{"--json", "--quiet", "pull"}, clientArgs(cfg, endpoint)...)
	return append(args,
		"--series", SeriesID(rj.Namespace, rj.Spec.SeriesRef.Name),
		"--version", itoa(version),
		"--cache", policy,
		"--cache-mib", itoa(CacheMiB(budget)),
		"-o", JobDataDir+"/",
	)
}

// RestoreLabels are the labels of a RestoreJob's Job and pod.
func RestoreLabels(restore string) map[string]string {
	l := commonLabels(ComponentRestore)
	l[LabelRestore] = LabelValue(restore)
	return l
}

// RestoreBatchJob is the Job of a RestoreJob. The target volume is mounted read-write.
func RestoreBatchJob(cfg *config.Config, rj *backupv1alpha1.RestoreJob, endpoint string, version int64) *batchv1.Job {
	spec := batchv1.JobSpec{
		BackoffLimit: cfg.Jobs.BackoffLimit,
		Template: jobPodSpec(cfg, RestoreLabels(rj.Name), RestoreArgs(cfg, rj, endpoint, version),
			corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: rj.Spec.TargetPVC.ClaimName}},
			false, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD"}),
	}
	if cfg.Jobs.ActiveDeadlineSeconds > 0 {
		spec.ActiveDeadlineSeconds = ptr.To(cfg.Jobs.ActiveDeadlineSeconds)
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:        RestoreJobName(rj.Name),
			Namespace:   rj.Namespace,
			Labels:      RestoreLabels(rj.Name),
			Annotations: map[string]string{AnnotationVersion: itoa(version)},
		},
		Spec: spec,
	}
}

// MoveArgs are the arguments of a move pod: copy the series from one worker to the other and
// check every version there; the operator deletes the source's copy itself, once the series'
// placement names the destination.
func MoveArgs(cfg *config.Config, bs *backupv1alpha1.BackupSeries, from, to string) []string {
	args := []string{"--json", "--quiet", "move", SeriesID(bs.Namespace, bs.Name),
		"--from", JobEndpoint(cfg, from), "--to", JobEndpoint(cfg, to), "--token-file", JobTokenFile, "--keep-source", "--prune-destination"}
	if cfg.TLSOn() {
		args = append(args, "--ca-cert", JobCAFile)
	}
	return args
}

// MoveLabels are the labels of a series' move Jobs and pods.
func MoveLabels(series string) map[string]string {
	l := commonLabels(ComponentMove)
	l[LabelSeries] = LabelValue(series)
	return l
}

// MoveJob copies a series to the worker at to (dest is its MEDIA/NODE). It runs in the series'
// namespace with the namespace's token, which both workers accept; it mounts no volume (the
// data goes from worker to worker through it) and needs no capability.
func MoveJob(cfg *config.Config, bs *backupv1alpha1.BackupSeries, from, to, dest string) *batchv1.Job {
	spec := batchv1.JobSpec{
		BackoffLimit: cfg.Jobs.BackoffLimit,
		Template: jobPodSpec(cfg, MoveLabels(bs.Name), MoveArgs(cfg, bs, from, to),
			corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}, true, nil),
	}
	// No deadline (jobs.activeDeadlineSeconds bounds a backup): a move takes as long as the
	// series' whole history takes to copy and check, and a cut one starts its check over.
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:        MoveJobName(bs.Name, dest),
			Namespace:   bs.Namespace,
			Labels:      MoveLabels(bs.Name),
			Annotations: map[string]string{AnnotationSeries: bs.Name, AnnotationMoveTo: dest},
		},
		Spec: spec,
	}
}
