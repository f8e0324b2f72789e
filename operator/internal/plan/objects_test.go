package plan

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(`
namespace: revault-system
worker:
  image: revault.local/revault:test
  hostPath: /mnt/revault
  env: [{name: MIMALLOC_PURGE_DELAY, value: "10"}]
pools:
  - media: ssd
    nodeSelector: {disk: fast}
    tolerations: [{key: storage, operator: Exists, effect: NoSchedule}]
  - media: hdd
jobs:
  activeDeadlineSeconds: 3600
`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWorkerDaemonSet(t *testing.T) {
	cfg := testConfig(t)
	pool, _ := cfg.Pool(backupv1alpha1.MediaSSD)
	ds := WorkerDaemonSet(cfg, pool)
	if ds.Name != "revault-worker-ssd" || ds.Namespace != "revault-system" {
		t.Fatalf("name %s/%s", ds.Namespace, ds.Name)
	}
	pod := ds.Spec.Template.Spec
	if want := map[string]string{"disk": "fast", "revault.io/storage": "ssd"}; !reflect.DeepEqual(pod.NodeSelector, want) {
		t.Errorf("nodeSelector %v, want %v", pod.NodeSelector, want)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "storage" {
		t.Errorf("tolerations %v", pod.Tolerations)
	}
	c := pod.Containers[0]
	wantArgs := []string{"serve", "--store", "/var/lib/revault", "--init", "--listen", "0.0.0.0:8420",
		"--token-file", "/etc/revault/tokens/tokens", "--quota-file", "/etc/revault/tokens/quotas", "--shutdown-delay", "5s", "--grace-period", "100s"}
	if !reflect.DeepEqual(c.Args, wantArgs) || !reflect.DeepEqual(c.Command, []string{"revault"}) {
		t.Errorf("command %v args %v", c.Command, c.Args)
	}
	if want := []corev1.EnvVar{{Name: "MIMALLOC_PURGE_DELAY", Value: "10"}}; !reflect.DeepEqual(c.Env, want) {
		t.Errorf("env %v, want %v", c.Env, want)
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz?exclude=writes" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes %v %v", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
	if hp := pod.Volumes[0].HostPath; hp == nil || hp.Path != "/mnt/revault/ssd" {
		t.Errorf("store volume %+v", pod.Volumes[0])
	}
	if s := pod.Volumes[1].Secret; s == nil || s.SecretName != WorkerTokensSecret {
		t.Errorf("tokens volume %+v", pod.Volumes[1])
	}
	sc := c.SecurityContext
	if !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) != 0 {
		t.Errorf("worker security context %+v", sc)
	}
	if *pod.AutomountServiceAccountToken {
		t.Errorf("worker pods must not get an API token")
	}
	// The selector must match the template, and must not include the per-node label the
	// operator adds later (a DaemonSet's selector is immutable).
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s not in the template labels", k, v)
		}
	}
	if _, ok := ds.Spec.Selector.MatchLabels[LabelNode]; ok {
		t.Errorf("selector includes %s", LabelNode)
	}
}

func TestWorkerDedupDomain(t *testing.T) {
	cfg := testConfig(t)
	pool, _ := cfg.Pool(backupv1alpha1.MediaSSD)
	args := WorkerDaemonSet(cfg, pool).Spec.Template.Spec.Containers[0].Args
	if slices.Contains(args, "--dedup-domain") {
		t.Errorf("no dedupDomain configured, yet args %v", args)
	}
	cfg.Worker.DedupDomain = "namespace"
	args = WorkerDaemonSet(cfg, pool).Spec.Template.Spec.Containers[0].Args
	if i := slices.Index(args, "--dedup-domain"); i < 0 || i+1 >= len(args) || args[i+1] != "namespace" {
		t.Errorf("dedupDomain namespace, args %v", args)
	}
}

func TestWorkerService(t *testing.T) {
	cfg := testConfig(t)
	svc := WorkerService(cfg, "hdd", "node-2")
	if svc.Name != "revault-worker-hdd-node-2" || svc.Annotations[AnnotationNode] != "node-2" {
		t.Fatalf("service %s %v", svc.Name, svc.Annotations)
	}
	want := map[string]string{LabelName: "revault", LabelComponent: "worker", LabelPool: "hdd", LabelNode: "node-2"}
	if !reflect.DeepEqual(svc.Spec.Selector, want) {
		t.Errorf("selector %v, want %v", svc.Spec.Selector, want)
	}
	if svc.Spec.Ports[0].Port != 8420 {
		t.Errorf("port %d", svc.Spec.Ports[0].Port)
	}
	if svc.Spec.PublishNotReadyAddresses {
		t.Error("a not-ready worker (a lost node's) must not receive traffic")
	}
	if got := WorkerEndpoint(svc.Name, "revault-system", 8420, false); got != "http://revault-worker-hdd-node-2.revault-system.svc:8420" {
		t.Errorf("endpoint %s", got)
	}
}

func series() *backupv1alpha1.BackupSeries {
	return &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "team-a"},
		Spec: backupv1alpha1.BackupSeriesSpec{
			Source:   backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: "db-data"}},
			Schedule: "0 2 * * *",
			Dedup:    backupv1alpha1.DedupSpec{Unit: backupv1alpha1.DedupChunk},
		},
	}
}

func TestBackupJobs(t *testing.T) {
	cfg := testConfig(t)
	bs := series()
	ep := "http://revault-worker-ssd-n1.revault-system.svc:8420"
	cj := BackupCronJob(cfg, bs, ep)
	if cj.Name != "db-backup" || cj.Spec.Schedule != "0 2 * * *" || cj.Spec.ConcurrencyPolicy != "Forbid" {
		t.Fatalf("cronjob %s %q %s", cj.Name, cj.Spec.Schedule, cj.Spec.ConcurrencyPolicy)
	}
	job := BackupNowJob(cfg, bs, ep, "2025-01-01")
	for _, spec := range []struct {
		what string
		pod  corev1.PodSpec
	}{{"cronjob", cj.Spec.JobTemplate.Spec.Template.Spec}, {"job", job.Spec.Template.Spec}} {
		c := spec.pod.Containers[0]
		want := "--json --quiet push --server " + ep + " --token-file /etc/revault/token --series team-a/db --unit chunk /data"
		if got := strings.Join(c.Args, " "); got != want {
			t.Errorf("%s args:\n got %s\nwant %s", spec.what, got, want)
		}
		pvc := spec.pod.Volumes[0].PersistentVolumeClaim
		if pvc == nil || pvc.ClaimName != "db-data" || !pvc.ReadOnly || !c.VolumeMounts[0].ReadOnly {
			t.Errorf("%s: the source PVC must be mounted read-only: %+v %+v", spec.what, pvc, c.VolumeMounts[0])
		}
		if s := spec.pod.Volumes[1].Secret; s == nil || s.SecretName != NamespaceTokenSecret {
			t.Errorf("%s: token volume %+v", spec.what, spec.pod.Volumes[1])
		}
		if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("%s: termination message policy %s", spec.what, c.TerminationMessagePolicy)
		}
		if !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"DAC_READ_SEARCH"}) {
			t.Errorf("%s: backup capabilities %v", spec.what, c.SecurityContext.Capabilities.Add)
		}
		if spec.pod.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("%s: restart policy %s", spec.what, spec.pod.RestartPolicy)
		}
	}
	if job.Spec.TTLSecondsAfterFinished == nil || *job.Spec.BackoffLimit != 3 || *job.Spec.ActiveDeadlineSeconds != 3600 {
		t.Errorf("job limits %+v", job.Spec)
	}
	if job.Annotations[AnnotationSeries] != "db" || job.Labels[LabelSeries] != "db" || job.Labels[LabelComponent] != ComponentBackup {
		t.Errorf("job labels %v annotations %v", job.Labels, job.Annotations)
	}
}

func TestRestoreJob(t *testing.T) {
	cfg := testConfig(t)
	budget := resource.MustParse("100Mi")
	rj := &backupv1alpha1.RestoreJob{
		ObjectMeta: metav1.ObjectMeta{Name: "r1", Namespace: "team-a"},
		Spec: backupv1alpha1.RestoreJobSpec{
			SeriesRef: backupv1alpha1.LocalObjectReference{Name: "db"},
			Version:   "latest",
			TargetPVC: backupv1alpha1.PVCTarget{ClaimName: "db-restored"},
			Cache:     backupv1alpha1.RestoreCacheSpec{Policy: "lru-container", MemoryBudget: &budget},
		},
	}
	job := RestoreBatchJob(cfg, rj, "http://w:8420", 7)
	c := job.Spec.Template.Spec.Containers[0]
	want := "--json --quiet pull --server http://w:8420 --token-file /etc/revault/token --series team-a/db --version 7 --cache lru-container --cache-mib 100 -o /data/"
	if got := strings.Join(c.Args, " "); got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
	pvc := job.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim
	if pvc == nil || pvc.ClaimName != "db-restored" || pvc.ReadOnly || c.VolumeMounts[0].ReadOnly {
		t.Errorf("the target PVC must be mounted read-write: %+v", pvc)
	}
	if job.Name != "r1-restore" || job.Labels[LabelRestore] != "r1" || job.Annotations[AnnotationVersion] != "7" {
		t.Errorf("job %s %v", job.Name, job.Labels)
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Add, "CHOWN") || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("restore security context %+v", c.SecurityContext)
	}
}

// With TLS the workers serve the certificate Secret and are probed over HTTPS, and Jobs reach
// them by https with the namespace's CA bundle mounted next to the token, also for a series
// whose recorded endpoint predates TLS.
func TestTLSWorkersAndJobs(t *testing.T) {
	cfg := testConfig(t)
	cfg.TLS = &config.TLSConfig{}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ssd, _ := cfg.Pool(backupv1alpha1.MediaSSD)
	c := WorkerDaemonSet(cfg, ssd).Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--tls-cert /etc/revault/tls/tls.crt --tls-key /etc/revault/tls/tls.key") {
		t.Errorf("worker args %q", args)
	}
	if c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Error("probes are not HTTPS")
	}
	vols := WorkerDaemonSet(cfg, ssd).Spec.Template.Spec.Volumes
	if i := slices.IndexFunc(vols, func(v corev1.Volume) bool { return v.Name == "tls" }); i < 0 || vols[i].Secret.SecretName != WorkerTLSSecret {
		t.Errorf("no volume of Secret %s: %+v", WorkerTLSSecret, vols)
	}
	cfg.TLS.Secret = "from-cert-manager"
	vols = WorkerDaemonSet(cfg, ssd).Spec.Template.Spec.Volumes
	if i := slices.IndexFunc(vols, func(v corev1.Volume) bool { return v.Name == "tls" }); i < 0 || vols[i].Secret.SecretName != "from-cert-manager" {
		t.Errorf("a provided Secret is not mounted: %+v", vols)
	}

	bs := &backupv1alpha1.BackupSeries{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "app"}}
	job := BackupJobSpec(cfg, bs, "http://revault-worker-ssd-n1.revault-system.svc:8420").Template.Spec
	jargs := strings.Join(job.Containers[0].Args, " ")
	if !strings.Contains(jargs, "--server https://revault-worker-ssd-n1.revault-system.svc:8420 --token-file /etc/revault/token --ca-cert /etc/revault/ca.crt") {
		t.Errorf("backup args %q", jargs)
	}
	tok := job.Volumes[slices.IndexFunc(job.Volumes, func(v corev1.Volume) bool { return v.Name == "token" })]
	if tok.Projected == nil || len(tok.Projected.Sources) != 2 ||
		tok.Projected.Sources[0].Secret.Name != NamespaceTokenSecret || tok.Projected.Sources[1].ConfigMap.Name != CAConfigMap {
		t.Errorf("token volume %+v", tok.VolumeSource)
	}
	cfg.TLS = nil
	if got := JobEndpoint(cfg, "https://w.ns.svc:8420"); got != "http://w.ns.svc:8420" {
		t.Errorf("TLS off: %s", got)
	}
}

// A move Job copies between two workers with the namespace's token, keeps the source's copy (the
// operator deletes it after the switch), mounts no data and adds no capability; with TLS both
// endpoints are https and the CA is trusted.
func TestMoveJob(t *testing.T) {
	cfg := testConfig(t)
	bs := series()
	from, to := "http://revault-worker-ssd-n1.revault-system.svc:8420", "http://revault-worker-ssd-n2.revault-system.svc:8420"
	job := MoveJob(cfg, bs, from, to, "ssd/n2")
	c := job.Spec.Template.Spec.Containers[0]
	want := "--json --quiet move team-a/db --from " + from + " --to " + to + " --token-file /etc/revault/token --keep-source --prune-destination"
	if got := strings.Join(c.Args, " "); got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
	if job.Name != MoveJobName("db", "ssd/n2") || job.Name == MoveJobName("db", "ssd/n3") || job.Namespace != "team-a" {
		t.Errorf("job %s/%s", job.Namespace, job.Name)
	}
	if job.Labels[LabelComponent] != ComponentMove || job.Annotations[AnnotationSeries] != "db" || job.Annotations[AnnotationMoveTo] != "ssd/n2" {
		t.Errorf("labels %v annotations %v", job.Labels, job.Annotations)
	}
	if job.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("a move has no deadline: %d", *job.Spec.ActiveDeadlineSeconds)
	}
	if len(c.SecurityContext.Capabilities.Add) != 0 || job.Spec.Template.Spec.Volumes[0].EmptyDir == nil {
		t.Errorf("a move needs no capability and no data volume: %v %+v", c.SecurityContext.Capabilities.Add, job.Spec.Template.Spec.Volumes[0])
	}
	cfg.TLS = &config.TLSConfig{}
	cfg.Default()
	args := strings.Join(MoveJob(cfg, bs, from, to, "ssd/n2").Spec.Template.Spec.Containers[0].Args, " ")
	for _, w := range []string{"--from https://revault-worker-ssd-n1", "--to https://revault-worker-ssd-n2", "--ca-cert /etc/revault/ca.crt"} {
		if !strings.Contains(args, w) {
			t.Errorf("TLS args %q lack %q", args, w)
		}
	}
}
