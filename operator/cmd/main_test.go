package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// TestManagerWithChartRBAC runs the real operator binary, as the chart installs it: with the
// chart's ServiceAccount identity and nothing but the chart's RBAC, its ConfigMap as config,
// leader election on, against its own envtest API server. It must start, become ready, run the
// worker pools, serve metrics, and reconcile a BackupSeries without a single "forbidden".
func TestManagerWithChartRBAC(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS must name the dir with kube-apiserver, etcd and kubectl (make test-operator)")
	}
	helm, err := exec.LookPath("helm")
	if err != nil {
		t.Fatal("helm not on PATH: run hack/k8s-tools.sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	repo, _ := filepath.Abs(filepath.Join("..", ".."))
	tmp := t.TempDir()

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repo, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	if err := backupv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	// Install the chart's RBAC and config (not its CRDs, which envtest installed, nor its
	// Deployment, which this test replaces by running the binary).
	const ns = "revault-op"
	for _, n := range []string{ns, "app"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.CommandContext(ctx, helm, "template", "rv", filepath.Join(repo, "charts", "revault"),
		"--namespace", ns, "--kube-version", "1.33.13", "--set", "crd.enabled=false").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var configYAML, saName string
	for _, doc := range strings.Split(string(out), "\n---") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil || len(u.Object) == 0 {
			continue
		}
		switch u.GetKind() {
		case "Deployment", "Service":
			continue
		case "ConfigMap":
			configYAML, _, _ = unstructured.NestedString(u.Object, "data", "config.yaml")
		case "ServiceAccount":
			saName = u.GetName()
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if configYAML == "" || saName == "" {
		t.Fatalf("the chart rendered no ConfigMap or ServiceAccount")
	}
	configPath := filepath.Join(tmp, "config.yaml")
	if err := os.WriteFile(configPath, []byte(configYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	// The API server authenticates this client certificate as the chart's ServiceAccount.
	user, err := env.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + ns + ":" + saName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	bin := filepath.Join(tmp, "manager")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kubeconfig, "--config", configPath,
		"--metrics-bind-address", metricsAddr, "--metrics-secure=false", "--health-probe-bind-address", probeAddr,
		"--leader-elect", "--sync-period", "2s")
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+ns)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		// Stopping the operator is cleanup: its exit status after the signal says nothing this
		// test checks.
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	defer stop()
	fail := func(format string, args ...any) {
		t.Helper()
		stop()
		t.Fatalf(format+"\noperator log:\n%s", append(args, logs.String())...)
	}
	eventually := func(what string, f func() error) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			err := f()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				fail("%s: %v", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	eventually("the operator becomes ready", func() error { return httpGet("http://"+probeAddr+"/readyz", nil) })
	eventually("the worker DaemonSets", func() error {
		for _, m := range []string{"ssd", "hdd"} {
			if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "revault-worker-" + m}, &appsv1.DaemonSet{}); err != nil {
				return err
			}
		}
		return nil
	})
	eventually("the worker token Secret", func() error {
		return admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "revault-worker-tokens"}, &corev1.Secret{})
	})
	eventually("the leader Lease", func() error {
		var leases unstructured.UnstructuredList
		leases.SetAPIVersion("coordination.k8s.io/v1")
		leases.SetKind("LeaseList")
		if err := admin.List(ctx, &leases, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(leases.Items) == 0 {
			return fmt.Errorf("no lease yet")
		}
		return nil
	})

	// A storage node with a worker pod: the operator labels the pod and makes its Service.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"revault.io/storage": "ssd"}}}
	if err := admin.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "revault-worker-ssd-abcde", Namespace: ns, Labels: map[string]string{
			"app.kubernetes.io/name": "revault", "app.kubernetes.io/part-of": "revault",
			"app.kubernetes.io/managed-by": "revault-operator", "app.kubernetes.io/component": "worker", "revault.io/pool": "ssd",
		}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "revault", Image: "x"}}},
	}
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually("the worker's Service and node label", func() error {
		if err := admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "revault-worker-ssd-n1"}, &corev1.Service{}); err != nil {
			return err
		}
		p := &corev1.Pod{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		if p.Labels["revault.io/node"] != "n1" {
			return fmt.Errorf("worker pod not labelled yet: %v", p.Labels)
		}
		return nil
	})

	// A BackupSeries in another namespace: a finalizer, a token Secret in its namespace, and
	// status (Pending: the worker pod is not ready).
	bs := &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "app"},
		Spec:       backupv1alpha1.BackupSeriesSpec{Source: backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: "data"}}},
	}
	if err := admin.Create(ctx, bs); err != nil {
		t.Fatal(err)
	}
	eventually("the BackupSeries is reconciled", func() error {
		cur := &backupv1alpha1.BackupSeries{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(bs), cur); err != nil {
			return err
		}
		if cur.Status.Phase != backupv1alpha1.SeriesPending || len(cur.Finalizers) == 0 {
			return fmt.Errorf("phase %q, finalizers %v", cur.Status.Phase, cur.Finalizers)
		}
		return admin.Get(ctx, types.NamespacedName{Namespace: "app", Name: "revault-token"}, &corev1.Secret{})
	})
	// Deleting it (no worker, Retain) lets it go.
	if err := admin.Delete(ctx, bs); err != nil {
		t.Fatal(err)
	}
	eventually("the BackupSeries goes", func() error {
		err := admin.Get(ctx, client.ObjectKeyFromObject(bs), &backupv1alpha1.BackupSeries{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})

	var metrics string
	eventually("metrics", func() error { return httpGet("http://"+metricsAddr+"/metrics", &metrics) })
	for _, want := range []string{
		`revault_operator_reconcile_outcomes_total{controller="backupseries",outcome="requeue"}`,
		`revault_operator_reconcile_outcomes_total{controller="workerpool",outcome="success"}`,
		`revault_operator_backupseries{phase="Pending"} 0`,
		`controller_runtime_reconcile_total{controller="backupseries"`,
	} {
		if !strings.Contains(metrics, want) {
			fail("metrics lack %s:\n%s", want, metrics)
		}
	}
	stop()
	for _, bad := range []string{"forbidden", "panic"} {
		if strings.Contains(logs.String(), bad) {
			t.Fatalf("the operator log says %q:\n%s", bad, logs.String())
		}
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

func httpGet(url string, body *string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	if body != nil {
		*body = string(b)
	}
	return nil
}
