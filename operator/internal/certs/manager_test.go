package certs

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
)

const opNS = "revault-system"

func newManager(c client.Client, now *time.Time) *Manager {
	return &Manager{Client: c, Reader: c, Namespace: opNS, Names: names, Life: life,
		Now: func() time.Time { return *now }}
}

func secret(t *testing.T, c client.Client, name string) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: opNS, Name: name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestManagerIssuesRenewsAndPublishes(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	now := t0
	m := newManager(c, &now)
	next, err := m.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := secret(t, c, plan.WorkerTLSSecret)
	if w.Type != corev1.SecretTypeTLS {
		t.Errorf("type %s, want kubernetes.io/tls", w.Type)
	}
	serving, err := ParsePair(w.Data[KeyCert], w.Data[KeyKey])
	if err != nil {
		t.Fatal(err)
	}
	roots, err := Roots(w.Data[KeyCA])
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(serving.Cert, roots, worker, now); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.Data[KeyKey]; !ok || len(secret(t, c, plan.CASecret).Data[KeyKey]) == 0 {
		t.Fatal("keys missing")
	}

	// Nothing due: nothing written.
	rv := w.ResourceVersion
	if _, err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if secret(t, c, plan.WorkerTLSSecret).ResourceVersion != rv {
		t.Error("the workers' Secret was rewritten with nothing due")
	}

	// A namespace gets the bundle, and an edited ConfigMap is put right.
	if err := m.EnsureNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: "app", Name: plan.CAConfigMap}
	if err := c.Get(ctx, key, cm); err != nil {
		t.Fatal(err)
	}
	if cm.Data[KeyCA] != string(w.Data[KeyCA]) {
		t.Error("the namespace's bundle is not the workers'")
	}
	cm.Data[KeyCA] = "tampered"
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	_ = c.Get(ctx, key, cm)
	if cm.Data[KeyCA] != string(w.Data[KeyCA]) {
		t.Error("a tampered bundle was left in place")
	}

	// When due, renewed: the new certificate chains to the same bundle.
	now = next
	if _, err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := secret(t, c, plan.WorkerTLSSecret)
	renewed, _ := ParsePair(w2.Data[KeyCert], w2.Data[KeyKey])
	if renewed.Cert.SerialNumber.Cmp(serving.Cert.SerialNumber) == 0 {
		t.Fatal("not renewed when due")
	}
	if err := Verify(renewed.Cert, roots, worker, now); err != nil {
		t.Error(err)
	}
}

// A CA rotation survives in the Secrets: the previous CA and when it was replaced are read back,
// so a restarted operator keeps signing with the previous CA until the delay is over.
func TestManagerKeepsARotationAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	now := t0
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ca, _ := ParsePair(secret(t, c, plan.CASecret).Data[KeyCert], secret(t, c, plan.CASecret).Data[KeyKey])
	now = RenewAt(ca.Cert)
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	// A new Manager (a restarted operator) sees the rotation.
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	w := secret(t, c, plan.WorkerTLSSecret)
	cas, _ := ParseCerts(w.Data[KeyCA])
	if len(cas) != 2 {
		t.Fatalf("bundle holds %d CAs, want the new and the previous", len(cas))
	}
	serving, _ := ParsePair(w.Data[KeyCert], w.Data[KeyKey])
	if !SignedBy(serving.Cert, ca.Cert) {
		t.Error("within the delay the serving certificate is not signed by the previous CA")
	}
}

func TestManagerUsesAProvidedSecret(t *testing.T) {
	ctx := context.Background()
	st, _ := renew(t, State{}, t0)
	bundle := Bundle(t0, st.CA.Cert)
	c := fake.NewClientBuilder().WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "from-cert-manager", Namespace: opNS},
		Data:       map[string][]byte{KeyCert: st.Serving.CertPEM, KeyKey: st.Serving.KeyPEM, KeyCA: bundle},
	}).Build()
	now := t0
	m := newManager(c, &now)
	m.Provided = "from-cert-manager"
	if _, err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := m.Bundle(ctx)
	if err != nil || string(got) != string(bundle) {
		t.Fatalf("bundle %q, %v", got, err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: opNS, Name: plan.CASecret}, &corev1.Secret{}); err == nil {
		t.Error("a CA was made although the certificate is provided")
	}
	// A provided Secret without ca.crt, or none at all, says which Secret lacks what.
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "no-ca", Namespace: opNS},
		Data:       map[string][]byte{KeyCert: st.Serving.CertPEM, KeyKey: st.Serving.KeyPEM},
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"no-ca", "missing"} {
		m := newManager(c, &now)
		m.Provided = name
		_, err := m.Ensure(ctx)
		if want := "secret " + opNS + "/" + name + " has no ca.crt"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("provided Secret %s: got %v, want an error saying %q", name, err, want)
		}
	}
}

// A CA Secret that no longer parses is reported, not replaced: a new CA would sign at once,
// before any client knows it. The workers' certificate stays as it was.
func TestManagerRefusesToReplaceAnUnreadableCA(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	now := t0
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	before := secret(t, c, plan.WorkerTLSSecret).Data[KeyCert]
	ca := secret(t, c, plan.CASecret)
	ca.Data[KeyKey] = []byte("not a key")
	if err := c.Update(ctx, ca); err != nil {
		t.Fatal(err)
	}
	_, err := newManager(c, &now).ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "holds no usable CA") || !strings.Contains(err.Error(), "delete the Secret") {
		t.Fatalf("got %v, want an error saying the CA is unusable and how to replace it", err)
	}
	if v := gaugeValue(t, metrics.TLSFailing); v != 1 {
		t.Errorf("revault_operator_worker_tls_failing is %v while the CA is unusable, want 1", v)
	}
	if string(secret(t, c, plan.WorkerTLSSecret).Data[KeyCert]) != string(before) ||
		string(secret(t, c, plan.CASecret).Data[KeyKey]) != "not a key" {
		t.Error("the Secrets were rewritten")
	}
	// Deleting the CA Secret is how a new CA is asked for.
	if err := c.Delete(ctx, ca); err != nil {
		t.Fatal(err)
	}
	if _, err := newManager(c, &now).ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(t, metrics.TLSFailing); v != 0 {
		t.Errorf("revault_operator_worker_tls_failing is %v once certificates are issued again, want 0", v)
	}

	// An unusable CA Secret from which no certificate was issued (made empty before the first
	// start) is replaced: nothing trusts it yet.
	fresh := fake.NewClientBuilder().WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: plan.CASecret, Namespace: opNS}}).Build()
	if _, err := newManager(fresh, &now).Ensure(ctx); err != nil {
		t.Fatalf("an empty CA Secret before the first start: %v", err)
	}
	if _, err := ParsePair(secret(t, fresh, plan.CASecret).Data[KeyCert], secret(t, fresh, plan.CASecret).Data[KeyKey]); err != nil {
		t.Fatal(err)
	}
}

// A CA replaced by hand under the annotation of an older rotation counts from when it was made.
func TestRotatedAtIsNeverBeforeTheCAWasMade(t *testing.T) {
	ca, err := NewCA(t0, life.CA)
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		annotationRotated: t0.Add(-30 * 24 * time.Hour).Format(time.RFC3339)}}}
	if got := rotatedAt(context.Background(), sec, ca); !got.Equal(t0) {
		t.Errorf("rotatedAt %s, want %s (when the CA was made)", got, t0)
	}
	sec.Annotations[annotationRotated] = t0.Add(time.Hour).Format(time.RFC3339)
	if got := rotatedAt(context.Background(), sec, ca); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("rotatedAt %s, want the annotation's %s", got, t0.Add(time.Hour))
	}
}

// A rotation whose annotation was lost still waits the publication delay (counted from when
// the new CA was made) before the serving certificate moves to the new CA.
func TestManagerWithoutTheRotationTimeKeepsThePreviousSigning(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	now := t0
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	first, _ := ParsePair(secret(t, c, plan.CASecret).Data[KeyCert], secret(t, c, plan.CASecret).Data[KeyKey])
	now = RenewAt(first.Cert)
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ca := secret(t, c, plan.CASecret)
	delete(ca.Annotations, annotationRotated)
	if err := c.Update(ctx, ca); err != nil {
		t.Fatal(err)
	}
	signer := func() *Pair {
		w := secret(t, c, plan.WorkerTLSSecret)
		serving, _ := ParsePair(w.Data[KeyCert], w.Data[KeyKey])
		if SignedBy(serving.Cert, first.Cert) {
			return &first
		}
		return nil
	}
	now = now.Add(PublishDelay - time.Hour)
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if signer() == nil {
		t.Fatal("without the annotation the serving certificate moved to the new CA before the delay")
	}
	now = now.Add(2 * time.Hour)
	if _, err := newManager(c, &now).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if signer() != nil {
		t.Fatal("after the delay the serving certificate is still signed by the previous CA")
	}
}

// gaugeValue reads a gauge as Prometheus would.
func gaugeValue(t *testing.T, g interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
