package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/certs"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/metrics"
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

// tls.secret naming a Secret that is missing (or not issued yet) makes a series wait, saying so in
// TokenReady, and one whose ca.crt does not parse is a warning naming the Secret; a RestoreJob
// waits the same way. Nothing else is attempted: no call to a worker could be verified.
func TestAMissingCABundleIsReportedOnTheSeries(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = backupv1alpha1.AddToScheme(scheme)
	bs := &backupv1alpha1.BackupSeries{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "db",
		Finalizers: []string{backupv1alpha1.SeriesFinalizer}}}
	bs.Spec.Source.External = &backupv1alpha1.ExternalSource{}
	cfg := &config.Config{Namespace: "revault-system", Worker: config.WorkerConfig{Port: 8420},
		TLS: &config.TLSConfig{Secret: "from-cert-manager"}}
	reconciler := func(c client.Client) *BackupSeriesReconciler {
		w := &Workers{Client: c, Config: cfg, Limits: DefaultCallLimits, Health: NewWorkerHealth(),
			Tokens: &tokens.Manager{Client: c, Reader: c, Namespace: cfg.Namespace},
			Certs:  &certs.Manager{Client: c, Reader: c, Namespace: cfg.Namespace, Provided: "from-cert-manager"}}
		return &BackupSeriesReconciler{Client: c, Scheme: scheme, Recorder: record.NewFakeRecorder(100), Config: cfg,
			Workers: w, Tokens: w.Tokens, SyncPeriod: time.Hour, Phases: metrics.NewPhaseTracker()}
	}
	key := types.NamespacedName{Namespace: "team", Name: "db"}

	// A status write that conflicts emits none of the run's events: the retry tells them.
	conflicting := fake.NewClientBuilder().WithScheme(scheme).WithObjects(bs.DeepCopy()).WithStatusSubresource(bs).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
			return apierrors.NewConflict(backupv1alpha1.GroupVersion.WithResource("backupseries").GroupResource(), "db", errors.New("modified"))
		}}).Build()
	rc := reconciler(conflicting)
	if _, err := rc.Reconcile(ctx, ctrl.Request{NamespacedName: key}); !apierrors.IsConflict(err) {
		t.Fatalf("want the conflict back, got %v", err)
	}
	if ev := rc.Recorder.(*record.FakeRecorder).Events; len(ev) != 0 {
		t.Fatalf("%d events emitted for a status that was not stored, first %q", len(ev), <-ev)
	}

	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(bs).WithStatusSubresource(bs).Build()
	r := reconciler(c)
	w := r.Workers
	expect := func(reason, msg string) {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		if err != nil {
			t.Fatal(err)
		}
		got := &backupv1alpha1.BackupSeries{}
		if err := c.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, backupv1alpha1.ConditionTokenReady)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != reason || !strings.Contains(cond.Message, msg) {
			t.Fatalf("TokenReady %+v: want False, %s, saying %q", cond, reason, msg)
		}
		if ready := meta.FindStatusCondition(got.Status.Conditions, backupv1alpha1.ConditionReady); ready == nil || ready.Reason != reason {
			t.Errorf("Ready %+v: want the reason %s", ready, reason)
		}
		if len(r.Recorder.(*record.FakeRecorder).Events) == 0 {
			t.Error("no event for the stored transition")
		}
		for len(r.Recorder.(*record.FakeRecorder).Events) > 0 {
			<-r.Recorder.(*record.FakeRecorder).Events
		}
		if got.Status.Worker != nil || got.Status.Phase != backupv1alpha1.SeriesPending || res.RequeueAfter == 0 {
			t.Errorf("worker %v, phase %s, requeue %s: want unplaced, Pending, looked at again", got.Status.Worker, got.Status.Phase, res.RequeueAfter)
		}
	}
	expect("CertificatePending", "secret revault-system/from-cert-manager has no ca.crt")
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: "from-cert-manager"},
		Data: map[string][]byte{certs.KeyCA: []byte("not PEM")}}); err != nil {
		t.Fatal(err)
	}
	expect("CredentialsUnavailable", "secret revault-system/from-cert-manager, ca.crt")

	rr := &RestoreJobReconciler{Client: c, Scheme: scheme, Recorder: record.NewFakeRecorder(10), Config: cfg, Workers: w}
	rj := &backupv1alpha1.RestoreJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "back"}}
	st := &restoreStart{rj: rj, o: &outcome{}, cs: conditionSetter{rec: rr.Recorder, obj: rj, conds: &rj.Status.Conditions}}
	res, stopped, err := rr.grant(ctx, st)
	cond := meta.FindStatusCondition(rj.Status.Conditions, backupv1alpha1.ConditionComplete)
	if err != nil || !stopped || res.RequeueAfter == 0 || cond == nil || cond.Reason != "CredentialsUnavailable" {
		t.Fatalf("restore: %v, stopped %v, requeue %s, Complete %+v: want a wait saying why", err, stopped, res.RequeueAfter, cond)
	}
}
