package plan

import (
	"path"
	"strconv"

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
	JobDataDir      = "/data"
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
	port := cfg.Worker.Port
	args := []string{"serve",
		"--store", WorkerStoreDir,
		"--init",
		"--listen", "0.0.0.0:" + strconv.Itoa(int(port)),
		"--token-file", path.Join(WorkerTokensDir, WorkerTokensKey),
		// On SIGTERM keep answering (with /readyz failing) while the Service drops the pod,
		// then let in-flight backups finish within the pod's grace period.
		"--shutdown-delay", "5s",
		"--grace-period", "100s",
	}
	if cfg.Worker.LogFormat != "" {
		args = append(args, "--log-format", cfg.Worker.LogFormat)
	}
	nodeSelector := map[string]string{}
	for k, v := range pool.NodeSelector {
		nodeSelector[k] = v
	}
	nodeSelector[backupv1alpha1.StorageLabel] = media
	tmpVol, tmpMount := tmpVolume()
	probe := func(p string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: p, Port: intstr.FromString("http")}},
			PeriodSeconds:    period,
			TimeoutSeconds:   5,
			FailureThreshold: 3,
		}
	}
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
				Spec: corev1.PodSpec{
					NodeSelector:                  nodeSelector,
					Tolerations:                   pool.Tolerations,
					PriorityClassName:             cfg.Worker.PriorityClassName,
					ImagePullSecrets:              cfg.Worker.ImagePullSecrets,
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To(int64(120)),
					SecurityContext: &corev1.PodSecurityContext{
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "revault",
						Image:           cfg.Worker.Image,
						ImagePullPolicy: cfg.Worker.ImagePullPolicy,
						Command:         cfg.Worker.Command,
						Args:            args,
						Env:             cfg.Worker.Env,
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
						Resources:       pool.Resources,
						ReadinessProbe:  probe("/readyz", 5),
						LivenessProbe:   probe("/healthz", 10),
						SecurityContext: restricted(0),
						VolumeMounts: []corev1.VolumeMount{
							{Name: "store", MountPath: WorkerStoreDir},
							{Name: "tokens", MountPath: WorkerTokensDir, ReadOnly: true},
							tmpMount,
						},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
					Volumes: []corev1.Volume{
						{Name: "store", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
							Path: path.Join(cfg.Worker.HostPath, media),
							Type: ptr.To(corev1.HostPathDirectoryOrCreate),
						}}},
						{Name: "tokens", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName:  WorkerTokensSecret,
							DefaultMode: ptr.To(int32(0o400)),
						}}},
						tmpVol,
					},
				},
			},
		},
	}
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
			// Only a ready worker (GET /readyz) receives traffic.
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
				{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName:  NamespaceTokenSecret,
					DefaultMode: ptr.To(int32(0o400)),
				}}},
				tmpVol,
			},
		},
	}
}

// BackupArgs are the arguments of a backup pod: push /data to the series' worker.
func BackupArgs(bs *backupv1alpha1.BackupSeries, endpoint string) []string {
	args := []string{"--json", "--quiet", "push",
		"--server", endpoint,
		"--token-file", JobTokenFile,
		"--series", SeriesID(bs.Namespace, bs.Name),
	}
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
		Template: jobPodSpec(cfg, BackupLabels(bs.Name), BackupArgs(bs, endpoint),
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
func RestoreArgs(rj *backupv1alpha1.RestoreJob, endpoint string, version int64) []string {
	policy := string(rj.Spec.Cache.Policy)
	if policy == "" {
		policy = "auto"
	}
	budget := int64(64 << 20)
	if rj.Spec.Cache.MemoryBudget != nil {
		budget = rj.Spec.Cache.MemoryBudget.Value()
	}
	return []string{"--json", "--quiet", "pull",
		"--server", endpoint,
		"--token-file", JobTokenFile,
		"--series", SeriesID(rj.Namespace, rj.Spec.SeriesRef.Name),
		"--version", itoa(version),
		"--cache", policy,
		"--cache-mib", itoa(CacheMiB(budget)),
		"-o", JobDataDir + "/",
	}
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
		Template: jobPodSpec(cfg, RestoreLabels(rj.Name), RestoreArgs(rj, endpoint, version),
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
