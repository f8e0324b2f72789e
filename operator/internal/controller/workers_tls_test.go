package controller

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/certs"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
)

// installTLS writes the workers' Secret to the files a worker pod mounts, renaming them in as
// the kubelet swaps a Secret volume.
func installTLS(t *testing.T, c client.Client, dir string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "revault-system", Name: plan.WorkerTLSSecret}, s); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{certs.KeyKey, certs.KeyCert} {
		tmp := filepath.Join(dir, k+".new")
		if err := os.WriteFile(tmp, s.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
}

// The operator's calls reach a worker serving the certificate its CA issued, checking the name
// of the worker's Service even when the call goes to another address (here loopback); a
// certificate renewed and swapped in is trusted without restarting anything; and a worker
// presenting the certificate for another namespace's Services is refused.
func TestOperatorCallsVerifyTheWorkersCertificate(t *testing.T) {
	bin := os.Getenv("REVAULT_BIN")
	if bin == "" {
		t.Fatal("REVAULT_BIN must name the revault binary (hack/operator-test.sh sets it)")
	}
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	cfg := &config.Config{Namespace: "revault-system", Worker: config.WorkerConfig{Port: 8420},
		TLS: &config.TLSConfig{}}
	m := &certs.Manager{Client: c, Reader: c, Namespace: cfg.Namespace,
		Names: certs.ServingNames(cfg.Namespace, "cluster.local"),
		Life:  certs.Lifetimes{CA: 300 * 24 * time.Hour, Serving: 90 * 24 * time.Hour}}
	if _, err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	tm := &tokens.Manager{Client: c, Reader: c, Namespace: cfg.Namespace}
	admin, err := tm.AdminToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	installTLS(t, c, dir)
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(admin+" *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := filepath.Join(dir, "addr")
	cmd := exec.Command(bin, "serve", "--store", filepath.Join(dir, "store"), "--init", "--listen", "127.0.0.1:0",
		"--addr-file", addr, "--token-file", filepath.Join(dir, "tokens"), "--token-reload", "100ms",
		"--maintenance-interval", "0", "--tls-cert", filepath.Join(dir, certs.KeyCert), "--tls-key", filepath.Join(dir, certs.KeyKey))
	logf, _ := os.Create(filepath.Join(dir, "serve.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	workers := func(namespace string) *Workers {
		cf := *cfg
		cf.Namespace = namespace
		w := &Workers{Client: c, Config: &cf, Tokens: tm, Limits: DefaultCallLimits, Health: NewWorkerHealth(), Certs: m}
		b, _ := os.ReadFile(addr)
		w.Overrides = map[string]string{"n1": "https://" + strings.TrimSpace(string(b))}
		return w
	}
	stats := func(w *Workers) error {
		api, err := w.API(ctx, "ssd", "n1")
		if err != nil {
			return err
		}
		_, err = api.Stats(ctx)
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for stats(workers(cfg.Namespace)) != nil {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			t.Fatalf("the worker never answered over TLS: %v\n%s", stats(workers(cfg.Namespace)), b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stats(workers("elsewhere")); err == nil || !strings.Contains(err.Error(), "not trusted for revault-worker-ssd-n1.elsewhere.svc") {
		t.Fatalf("a certificate for another namespace's Services: want refused, got %v", err)
	}

	// Reissued (the Secret deleted, as to force a rotation) and swapped in: the worker serves
	// the new certificate, and the operator trusts it.
	old := &corev1.Secret{}
	_ = c.Get(ctx, types.NamespacedName{Namespace: cfg.Namespace, Name: plan.WorkerTLSSecret}, old)
	if err := c.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	installTLS(t, c, dir)
	b, _ := os.ReadFile(addr)
	waitServed(t, c, strings.TrimSpace(string(b)))
	if err := stats(workers(cfg.Namespace)); err != nil {
		t.Fatalf("after the renewal: %v", err)
	}

	// A certificate with the right names from a CA the operator does not trust (another
	// operator's, an attacker's) is refused.
	other := fake.NewClientBuilder().Build()
	if _, err := (&certs.Manager{Client: other, Reader: other, Namespace: cfg.Namespace, Names: m.Names, Life: m.Life}).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	installTLS(t, other, dir)
	waitServed(t, other, strings.TrimSpace(string(b)))
	if err := stats(workers(cfg.Namespace)); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a certificate from an unknown CA: want refused, got %v", err)
	}
}

// waitServed waits until the worker at addr serves the certificate of c's workers' Secret.
func waitServed(t *testing.T, c client.Client, addr string) {
	t.Helper()
	sec := &corev1.Secret{}
	_ = c.Get(context.Background(), types.NamespacedName{Namespace: "revault-system", Name: plan.WorkerTLSSecret}, sec)
	want, err := certs.ParseCerts(sec.Data[certs.KeyCert])
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the certificate
		if err != nil {
			t.Fatal(err)
		}
		served := conn.ConnectionState().PeerCertificates[0]
		_ = conn.Close()
		if served.SerialNumber.Cmp(want[0].SerialNumber) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker never served the new certificate")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tls.secret naming a Secret that is missing or has no ca.crt stops the series' Jobs with a
// TokenReady condition that names the Secret, rather than failing each reconcile in the log only.
func TestAMissingCABundleIsReportedOnTheSeries(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	cfg := &config.Config{Namespace: "revault-system", Worker: config.WorkerConfig{Port: 8420},
		TLS: &config.TLSConfig{Secret: "from-cert-manager"}}
	w := &Workers{Client: c, Config: cfg, Limits: DefaultCallLimits, Health: NewWorkerHealth(),
		Tokens: &tokens.Manager{Client: c, Reader: c, Namespace: cfg.Namespace},
		Certs:  &certs.Manager{Client: c, Reader: c, Namespace: cfg.Namespace, Provided: "from-cert-manager"}}
	r := &BackupSeriesReconciler{Workers: w, Recorder: record.NewFakeRecorder(10)}
	bs := &backupv1alpha1.BackupSeries{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "db"}}
	bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: "ssd", Node: "n1"}
	s := &seriesRun{bs: bs, o: &outcome{}, requeue: time.Hour}
	s.cs = conditionSetter{rec: r.Recorder, obj: bs, conds: &bs.Status.Conditions}
	for _, step := range []func(context.Context, *seriesRun) (ctrl.Result, bool, error){r.ensureNamespaceToken, r.checkToken} {
		if _, stop, err := step(ctx, s); stop || err != nil {
			t.Fatalf("step stopped the reconcile (%v): the condition would not be written", err)
		}
	}
	cond := meta.FindStatusCondition(bs.Status.Conditions, backupv1alpha1.ConditionTokenReady)
	if s.tokenReady || cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "CredentialsUnavailable" ||
		!strings.Contains(cond.Message, "secret revault-system/from-cert-manager has no ca.crt") {
		t.Fatalf("tokenReady %v, condition %+v: want TokenReady False naming the Secret", s.tokenReady, cond)
	}
	if s.requeue != 30*time.Second {
		t.Errorf("requeue %s, want 30s", s.requeue)
	}
}
