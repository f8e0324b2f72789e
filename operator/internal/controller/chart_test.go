package controller

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/revault-io/revault/operator/internal/config"
)

// splitDocs splits a multi-document YAML stream into its non-empty objects.
func splitDocs(s string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split("\n"+s, "\n---") {
		if strings.TrimSpace(strings.ReplaceAll(doc, "\n#", "\n")) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(doc), &u.Object)).To(Succeed(), doc)
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	return out
}

func run(stdin string, name string, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func convert[T any](u *unstructured.Unstructured, out *T) *T {
	b, err := yaml.Marshal(u.Object)
	Expect(err).NotTo(HaveOccurred())
	Expect(yaml.Unmarshal(b, out)).To(Succeed())
	return out
}

var _ = Describe("Helm chart and kustomize manifests", Ordered, func() {
	var helm, kubectl, kubeconfig, chart string

	BeforeAll(func() {
		var err error
		helm, err = exec.LookPath("helm")
		Expect(err).NotTo(HaveOccurred(), "helm not on PATH: run hack/k8s-tools.sh")
		kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
		Expect(kubectl).To(BeAnExistingFile())
		user, err := testEnv.AddUser(envtest.User{Name: "chart-admin", Groups: []string{"system:masters"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		kc, err := user.KubeConfig()
		Expect(err).NotTo(HaveOccurred())
		kubeconfig = filepath.Join(scratch, "kubeconfig")
		Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
		chart = filepath.Join(repoRoot, "charts", "revault")
	})

	template := func(ns string, set ...string) string {
		args := []string{"template", "rv", chart, "--namespace", ns, "--kube-version", "1.33.13"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, errOut, err := run("", helm, args...)
		Expect(err).NotTo(HaveOccurred(), errOut)
		return out
	}
	dryRun := func(manifests string) string {
		out, errOut, err := run(manifests, kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side",
			"--field-manager", "chart-test", "--dry-run=server", "-f", "-")
		Expect(err).NotTo(HaveOccurred(), "kubectl apply --server-side --dry-run=server:\n%s%s", out, errOut)
		return out
	}

	It("passes helm lint, and its schema rejects bad values", func() {
		out, errOut, err := run("", helm, "lint", chart, "--strict", "--kube-version", "1.33.13")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		for set, want := range map[string]string{
			"worker.pools[0].media=nvme":  "at '/worker/pools/0/media': value must be one of 'ssd', 'hdd'",
			"worker.hostPath=relative":    "at '/worker/hostPath': 'relative' does not match pattern '^/'",
			"operator.syncPeriod=often":   "at '/operator/syncPeriod': 'often' does not match pattern",
			"operator.minFreePercent=150": "at '/operator/minFreePercent': maximum: got 150, want 100",
			"tls.certValidity=soon":       "at '/tls/certValidity': 'soon' does not match pattern",
			"worker.dedupDomain=tenant":   "at '/worker/dedupDomain': value must be one of 'store', 'namespace'",
			"surprise=1":                  "additional properties 'surprise' not allowed",
		} {
			out, errOut, err := run("", helm, "lint", chart, "--kube-version", "1.33.13", "--set", set)
			Expect(err).To(HaveOccurred(), "helm lint accepted --set %s", set)
			Expect(out + errOut).To(ContainSubstring(want))
		}
	})

	It("renders manifests the API server accepts (server-side dry run)", func() {
		ns := newNamespace("chart")
		rendered := template(ns, "worker.image.repository=revault.local/revault", "worker.image.tag=dev",
			"operator.image.repository=revault.local/revault-operator", "operator.image.tag=dev")
		out := dryRun(rendered)
		Expect(out).To(ContainSubstring("deployment.apps/rv-revault-operator serverside-applied (server dry run)"))
		Expect(out).To(ContainSubstring("customresourcedefinition.apiextensions.k8s.io/backupseries.backup.revault.io serverside-applied"))

		objs := splitDocs(rendered)
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
		}
		Expect(kinds).To(Equal(map[string]int{
			"CustomResourceDefinition": 3, "ServiceAccount": 1, "ClusterRole": 4, "ClusterRoleBinding": 1,
			"Role": 1, "RoleBinding": 1, "ConfigMap": 1, "Deployment": 1, "Service": 1, "NetworkPolicy": 1,
		}))
		generated, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		genRules := map[string][]rbacv1.PolicyRule{}
		for _, g := range splitDocs(string(generated)) {
			genRules[g.GetKind()] = convert(g, &rbacv1.ClusterRole{}).Rules
		}
		// Which objects the checks below looked at: a renamed object must not skip its check.
		checked := map[string]int{}
		for _, o := range objs {
			switch {
			case o.GetKind() == "CustomResourceDefinition":
				Expect(o.GetAnnotations()).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
			case o.GetKind() == "ClusterRole" && o.GetName() == "rv-revault-operator":
				Expect(convert(o, &rbacv1.ClusterRole{}).Rules).To(Equal(genRules["ClusterRole"]))
			case o.GetKind() == "Role":
				Expect(o.GetNamespace()).To(Equal(ns))
				Expect(convert(o, &rbacv1.Role{}).Rules).To(Equal(genRules["Role"]))
			case o.GetKind() == "ConfigMap":
				cfg, err := config.Parse([]byte(convert(o, &corev1.ConfigMap{}).Data["config.yaml"]))
				Expect(err).NotTo(HaveOccurred())
				Expect(cfg.Namespace).To(Equal(ns))
				Expect(cfg.Worker.Image).To(Equal("revault.local/revault:dev"))
				Expect(cfg.Jobs.Image).To(Equal("revault.local/revault:dev"))
				Expect(cfg.Pools).To(HaveLen(2))
			case o.GetKind() == "Deployment":
				d := convert(o, &appsv1.Deployment{})
				pod := d.Spec.Template.Spec
				Expect(*pod.SecurityContext.RunAsNonRoot).To(BeTrue())
				c := pod.Containers[0]
				Expect(c.Image).To(Equal("revault.local/revault-operator:dev"))
				Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
				Expect(*c.SecurityContext.AllowPrivilegeEscalation).To(BeFalse())
				Expect(c.Args).To(ContainElements("--leader-elect=true", "--metrics-bind-address=:8443",
					"--max-concurrent-reconciles=4", "--worker-timeout=15s", "--worker-heavy-timeout=2m", "--worker-pause=30s",
					"--min-free-percent=10"))
				// It leaves a lost node quickly: it is what rebuilds the stores of lost nodes.
				for _, key := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
					Expect(pod.Tolerations).To(ContainElement(corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
						Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(30))}))
				}
			default:
				continue
			}
			checked[o.GetKind()]++
		}
		Expect(checked).To(Equal(map[string]int{
			"CustomResourceDefinition": 3, "ClusterRole": 1, "Role": 1, "ConfigMap": 1, "Deployment": 1,
		}))
		// Cluster-wide, the operator may read only Secrets named revault-token (the namespace
		// token copies it writes); it reads other Secrets only in its own namespace (the Role).
		for _, r := range genRules["ClusterRole"] {
			if slices.Contains(r.Resources, "secrets") && len(r.ResourceNames) == 0 {
				Expect(r.Verbs).NotTo(ContainElement(BeElementOf("get", "list", "watch")),
					"cluster-wide secret read in %v", r)
			}
		}
		Expect(genRules["ClusterRole"]).NotTo(ContainElement(HaveField("Verbs", ContainElement("*"))))
		// Without the data mover, no rule lets the operator touch PersistentVolumes, delete
		// PVCs or VolumeSnapshots, or create BackupSeries (users' roles, editor and viewer, are
		// not the operator's).
		for _, o := range objs {
			if o.GetKind() != "ClusterRole" || strings.HasSuffix(o.GetName(), "-editor") || strings.HasSuffix(o.GetName(), "-viewer") {
				continue
			}
			for _, r := range convert(o, &rbacv1.ClusterRole{}).Rules {
				Expect(r.Resources).NotTo(ContainElement("persistentvolumes"), "%s: %v", o.GetName(), r)
				Expect(r.APIGroups).NotTo(ContainElement(BeElementOf("snapshot.storage.k8s.io", "velero.io")), "%s: %v", o.GetName(), r)
				if slices.Contains(r.Resources, "persistentvolumeclaims") || slices.Contains(r.Resources, "backupseries") {
					Expect(r.Verbs).NotTo(ContainElement(BeElementOf("create", "delete")), "%s: %v", o.GetName(), r)
				}
			}
		}
	})

	It("grants the Velero data mover's rules only with velero.dataMover", func() {
		ns := newNamespace("datamover")
		rendered := template(ns, "velero.dataMover=true")
		generated, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "datamover", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		want := convert(splitDocs(string(generated))[0], &rbacv1.ClusterRole{}).Rules
		Expect(want).To(ContainElement(HaveField("Resources", ContainElement("persistentvolumes"))))
		found := map[string]bool{}
		for _, o := range splitDocs(rendered) {
			switch {
			case o.GetKind() == "ClusterRole" && o.GetName() == "rv-revault-datamover":
				Expect(convert(o, &rbacv1.ClusterRole{}).Rules).To(Equal(want))
				found["role"] = true
			case o.GetKind() == "ClusterRoleBinding" && o.GetName() == "rv-revault-datamover":
				b := convert(o, &rbacv1.ClusterRoleBinding{})
				Expect(b.RoleRef.Name).To(Equal("rv-revault-datamover"))
				Expect(b.Subjects).To(ContainElement(HaveField("Namespace", ns)))
				found["binding"] = true
			case o.GetKind() == "Deployment":
				Expect(convert(o, &appsv1.Deployment{}).Spec.Template.Spec.Containers[0].Args).To(ContainElement("--velero-data-mover"))
				found["flag"] = true
			}
		}
		Expect(found).To(Equal(map[string]bool{"role": true, "binding": true, "flag": true}))
		dryRun(rendered)
	})

	It("renders the dedup domain into the operator's config: store by default, namespace when asked", func() {
		workerCfg := func(sets ...string) config.WorkerConfig {
			for _, o := range splitDocs(template(newNamespace("dedup"), sets...)) {
				if o.GetKind() == "ConfigMap" {
					cfg, err := config.Parse([]byte(convert(o, &corev1.ConfigMap{}).Data["config.yaml"]))
					Expect(err).NotTo(HaveOccurred())
					return cfg.Worker
				}
			}
			Fail("no ConfigMap rendered")
			return config.WorkerConfig{}
		}
		Expect(workerCfg().DedupDomain).To(Equal("store"))
		Expect(workerCfg("worker.dedupDomain=namespace").DedupDomain).To(Equal("namespace"))
	})

	It("renders the remote into the operator's config, and refuses a remote without its key Secret", func() {
		ns := newNamespace("remote")
		rendered := template(ns, "remote.enabled=true", "remote.url=s3://backups/cluster-a",
			"remote.endpoint=http://rgw.storage:7480", "remote.credentialsSecret=s3-creds",
			"remote.keySecret=revault-remote-key", "remote.lostNodeTimeout=5m")
		var cfg *config.Config
		for _, o := range splitDocs(rendered) {
			if o.GetKind() == "ConfigMap" {
				var err error
				cfg, err = config.Parse([]byte(convert(o, &corev1.ConfigMap{}).Data["config.yaml"]))
				Expect(err).NotTo(HaveOccurred())
			}
		}
		Expect(cfg.Remote).NotTo(BeNil())
		Expect(cfg.Remote.StoreURL("ssd", "n1")).To(Equal("s3://backups/cluster-a/ssd/n1"))
		Expect(cfg.Remote.Endpoint).To(Equal("http://rgw.storage:7480"))
		Expect(cfg.Remote.KeySecret).To(Equal("revault-remote-key"))
		Expect(cfg.Remote.LostNodeTimeout.Duration.String()).To(Equal("5m0s"))
		dryRun(rendered)
		_, errOut, err := run("", helm, "template", "rv", chart, "--kube-version", "1.33.13",
			"--set", "remote.enabled=true", "--set", "remote.url=s3://backups")
		Expect(err).To(HaveOccurred())
		Expect(errOut).To(ContainSubstring("remote.keySecret is required"))
		out, errOut, err := run("", helm, "lint", chart, "--kube-version", "1.33.13", "--set", "remote.url=http://x")
		Expect(err).To(HaveOccurred())
		Expect(out + errOut).To(ContainSubstring("/remote/url"))
	})

	It("turns TLS on by default, takes a provided Secret, and can be turned off", func() {
		ns := newNamespace("tls")
		parse := func(rendered string) *config.Config {
			for _, o := range splitDocs(rendered) {
				if o.GetKind() == "ConfigMap" {
					cfg, err := config.Parse([]byte(convert(o, &corev1.ConfigMap{}).Data["config.yaml"]))
					Expect(err).NotTo(HaveOccurred())
					return cfg
				}
			}
			Fail("no ConfigMap rendered")
			return nil
		}
		cfg := parse(template(ns))
		Expect(cfg.TLS).NotTo(BeNil())
		Expect(cfg.TLS.CertValidity.Duration).To(Equal(90 * 24 * time.Hour))
		Expect(cfg.TLS.Secret).To(BeEmpty())
		cfg = parse(template(ns, "tls.secret=worker-cert"))
		Expect(cfg.TLS.Secret).To(Equal("worker-cert"))
		off := template(ns, "tls.enabled=false", "networkPolicy.enabled=false")
		Expect(parse(off).TLS).To(BeNil())
		Expect(off).NotTo(ContainSubstring("kind: NetworkPolicy"))
		// Velero's namespace is let in by default (the plugin calls the workers from Velero's
		// pod); extra peers are rendered after it.
		policy := func(rendered string) *networkingv1.NetworkPolicy {
			for _, o := range splitDocs(rendered) {
				if o.GetKind() == "NetworkPolicy" {
					return convert(o, &networkingv1.NetworkPolicy{})
				}
			}
			Fail("no NetworkPolicy rendered")
			return nil
		}
		with := template(ns, "networkPolicy.extraFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring")
		dryRun(with)
		np := policy(with)
		Expect(np.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue("app.kubernetes.io/component", "worker"))
		Expect(np.Spec.Ingress[0].From).To(HaveLen(4))
		Expect(np.Spec.Ingress[0].From[2].NamespaceSelector.MatchLabels).To(HaveKeyWithValue("kubernetes.io/metadata.name", "velero"))
		Expect(np.Spec.Ingress[0].From[2].PodSelector).To(BeNil())
		Expect(np.Spec.Ingress[0].From[3].NamespaceSelector.MatchLabels).To(HaveKeyWithValue("kubernetes.io/metadata.name", "monitoring"))
		noVelero := policy(template(ns, "networkPolicy.veleroNamespace="))
		Expect(noVelero.Spec.Ingress[0].From).To(HaveLen(2))
	})

	It("leaves the CRDs out with crd.enabled=false", func() {
		ns := newNamespace("nocrd")
		rendered := template(ns, "crd.enabled=false", "operator.metrics.enabled=false")
		for _, o := range splitDocs(rendered) {
			Expect(o.GetKind()).NotTo(Equal("CustomResourceDefinition"))
			Expect(o.GetKind()).NotTo(Equal("Service"))
		}
		dryRun(rendered)
	})

	It("builds config/default with kustomize into manifests the API server accepts", func() {
		out, errOut, err := run("", kubectl, "kustomize", filepath.Join(repoRoot, "config", "default"))
		Expect(err).NotTo(HaveOccurred(), errOut)
		objs := splitDocs(out)
		for _, o := range objs {
			if o.GetNamespace() != "" {
				Expect(o.GetNamespace()).To(Equal("revault-system"))
			}
			if o.GetKind() == "ConfigMap" {
				cfg := convert(o, &corev1.ConfigMap{})
				_, err := config.Parse([]byte(cfg.Data["config.yaml"]))
				Expect(err).NotTo(HaveOccurred())
			}
		}
		dryRun(out)
	})
})
