package plan

import (
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
)

func remoteConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(`
namespace: revault-system
worker: {image: revault.local/revault:test, hostPath: /mnt/revault}
pools: [{media: ssd, nodeSelector: {disk: fast}}, {media: hdd}]
remote:
  url: s3://backups/cluster-a
  endpoint: http://rgw.storage:7480
  credentialsSecret: s3-creds
  keySecret: revault-remote-key
  objectLockDays: 30
`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// Each node's worker keeps its store's copy under <url>/<media>/<its node>, rebuilds an empty
// store from it (--recover), reads the key file from the key Secret and the credentials from
// theirs.
func TestWorkerDaemonSetWithARemote(t *testing.T) {
	cfg := remoteConfig(t)
	pool, _ := cfg.Pool(backupv1alpha1.MediaSSD)
	pod := WorkerDaemonSet(cfg, pool).Spec.Template.Spec
	c := pod.Containers[0]
	if !slices.Contains(c.Args, "--recover") || !slices.Contains(c.Args, "--sync-interval") {
		t.Errorf("args %v", c.Args)
	}
	env := envOf(c)
	// NODE_NAME comes before the URL that names it, so Kubernetes expands it.
	if c.Env[0].Name != "NODE_NAME" || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("first env %+v", c.Env[0])
	}
	if env["REVAULT_REMOTE"].Value != "s3://backups/cluster-a/ssd/$(NODE_NAME)" ||
		env["REVAULT_KEY_FILE"].Value != "/etc/revault/remote-key/key" ||
		env["AWS_ENDPOINT_URL"].Value != "http://rgw.storage:7480" ||
		env["REVAULT_OBJECT_LOCK_DAYS"].Value != "30" {
		t.Errorf("env %+v", env)
	}
	if r := env["AWS_SECRET_ACCESS_KEY"].ValueFrom.SecretKeyRef; r == nil || r.Name != "s3-creds" || r.Key != "AWS_SECRET_ACCESS_KEY" {
		t.Errorf("credentials %+v", env["AWS_SECRET_ACCESS_KEY"])
	}
	var key *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == "remote-key" {
			key = &pod.Volumes[i]
		}
	}
	if key == nil || key.Secret.SecretName != "revault-remote-key" || *key.Secret.DefaultMode != 0o400 {
		t.Errorf("key volume %+v", key)
	}
	// Without a remote nothing of it appears.
	plain := WorkerDaemonSet(testConfig(t), pool).Spec.Template.Spec.Containers[0]
	if slices.Contains(plain.Args, "--recover") || envOf(plain)["REVAULT_REMOTE"].Name != "" {
		t.Errorf("a worker without a remote: args %v env %v", plain.Args, plain.Env)
	}
}

// The adopted store of lost node n1: one pod, never two at once, on another node of the pool,
// serving n1's store (its label and annotation, its place in the bucket) from a directory of
// its own on its host.
func TestAdoptedStore(t *testing.T) {
	cfg := remoteConfig(t)
	pool, _ := cfg.Pool(backupv1alpha1.MediaSSD)
	d := AdoptedStore(cfg, pool, "n1", "n2")
	if d.Name != "revault-store-ssd-n1" || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != "Recreate" {
		t.Errorf("deployment %s replicas %d strategy %s", d.Name, *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	tpl := d.Spec.Template
	if tpl.Labels[LabelNode] != "n1" || tpl.Labels[LabelAdopted] != "true" || tpl.Annotations[AnnotationNode] != "n1" {
		t.Errorf("template labels %v annotations %v", tpl.Labels, tpl.Annotations)
	}
	// The node's Service selects it.
	for k, v := range WorkerService(cfg, "ssd", "n1").Spec.Selector {
		if tpl.Labels[k] != v {
			t.Errorf("the Service of n1 selects %s=%s, the adopted pod has %q", k, v, tpl.Labels[k])
		}
	}
	term := tpl.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]
	// Pinned to the node that rebuilt it: a replaced pod must find the store (and its lock)
	// where it was, never rebuild it elsewhere and fence out its predecessor.
	if f := term.MatchFields[0]; f.Key != "metadata.name" || f.Operator != "In" || !reflect.DeepEqual(f.Values, []string{"n2"}) {
		t.Errorf("it must run only on its host n2: %+v", f)
	}
	if d.Annotations[AnnotationHost] != "n2" {
		t.Errorf("annotations %v", d.Annotations)
	}
	want := []corev1.NodeSelectorRequirement{
		{Key: "disk", Operator: "In", Values: []string{"fast"}},
		{Key: "revault.io/storage", Operator: "In", Values: []string{"ssd"}},
	}
	if !reflect.DeepEqual(term.MatchExpressions, want) {
		t.Errorf("pool affinity %+v", term.MatchExpressions)
	}
	if hp := tpl.Spec.Volumes[0].HostPath; hp.Path != "/mnt/revault/adopted/ssd-n1" {
		t.Errorf("store directory %s", hp.Path)
	}
	if env := envOf(tpl.Spec.Containers[0]); env["REVAULT_REMOTE"].Value != "s3://backups/cluster-a/ssd/n1" {
		t.Errorf("remote %s", env["REVAULT_REMOTE"].Value)
	}
	// It takes the store over from wherever it was (the lost node), and keeps it one level
	// down in its volume so that a superseded copy can be moved aside.
	args := tpl.Spec.Containers[0].Args
	if !slices.Contains(args, "--adopt") || args[slices.Index(args, "--store")+1] != "/var/lib/revault/store" {
		t.Errorf("args %v", args)
	}
	if ds := WorkerDaemonSet(cfg, pool).Spec.Template.Spec.Containers[0].Args; slices.Contains(ds, "--adopt") {
		t.Errorf("a DaemonSet worker rebuilds only its own store: %v", ds)
	}
	long := AdoptedStore(cfg, pool, "ip-10-0-12-34.eu-west-1.compute.internal.example.cluster.local", "n2")
	if len(long.Name) > 52 {
		t.Errorf("name %s is longer than 52", long.Name)
	}
}
