package certs

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/internal/plan"
)

// Keys of the Secrets and ConfigMaps (those of kubernetes.io/tls Secrets and of cert-manager).
const (
	KeyCert        = corev1.TLSCertKey
	KeyKey         = corev1.TLSPrivateKeyKey
	KeyCA          = "ca.crt"
	keyPrevious    = "previous.crt"
	keyPreviousKey = "previous.key"
	// annotationRotated holds when the CA Secret's CA replaced the one in previous.crt.
	annotationRotated = "revault.io/ca-rotated-at"
)

// Manager keeps the CA and the workers' TLS Secrets, and hands out the CA bundle. Reads of the
// operator's Secrets go to the API server (Reader): a CA must never be made twice because a
// cache was behind.
type Manager struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
	// Names are the DNS names on the serving certificate.
	Names []string
	Life  Lifetimes
	// Provided is a Secret (tls.crt, tls.key, ca.crt: e.g. a cert-manager Certificate's) the
	// workers use instead of one the operator issues; the operator only reads its ca.crt.
	Provided string
	Now      func() time.Time
	// Cache, when set, wakes Start when one of the operator's Secrets changes or goes, so a
	// Secret deleted to force a rotation is replaced at once.
	Cache cache.Cache

	mu     sync.Mutex
	bundle []byte
	roots  *x509.CertPool
	read   time.Time
}

// Retry is how soon Start tries again after a failure, bundleTTL how long a bundle read from
// the Secret is used before it is read again (another replica may have rotated it), and
// maxSleep the longest Start waits between two looks (a Secret deleted by hand to force a
// rotation is replaced within it).
const (
	Retry     = 30 * time.Second
	bundleTTL = time.Minute
	maxSleep  = 5 * time.Minute
)

// NeedLeaderElection: only the leader issues certificates.
func (m *Manager) NeedLeaderElection() bool { return true }

// Start keeps the certificates fresh until ctx ends (a manager.Runnable).
func (m *Manager) Start(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	if err := m.watch(ctx, wake); err != nil {
		return err
	}
	for {
		wait := Retry
		next, err := m.ensure(ctx)
		if err == nil {
			wait = min(max(next.Sub(m.now()), time.Second), maxSleep)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-time.After(wait):
		}
	}
}

// ensure is Ensure for the renewal loop: a failure is logged and shown on the
// revault_operator_worker_tls_failing gauge until an attempt succeeds.
func (m *Manager) ensure(ctx context.Context) (time.Time, error) {
	next, err := m.Ensure(ctx)
	if err != nil {
		metrics.TLSFailing.Set(1)
		log.FromContext(ctx).Error(err, "worker TLS certificates")
		return next, err
	}
	metrics.TLSFailing.Set(0)
	return next, nil
}

// watch sends on wake when the CA Secret or the workers' Secret is changed or deleted by
// anyone (the operator's own writes included; an Ensure with nothing due writes nothing).
func (m *Manager) watch(ctx context.Context, wake chan<- struct{}) error {
	if m.Cache == nil {
		return nil
	}
	inf, err := m.Cache.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return err
	}
	poke := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		s, ok := obj.(*corev1.Secret)
		if !ok || s.Namespace != m.Namespace || (s.Name != plan.CASecret && s.Name != plan.WorkerTLSSecret) {
			return
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { poke(obj) },
		DeleteFunc: poke,
	})
	return err
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// WorkerSecret is the Secret the workers mount.
func (m *Manager) WorkerSecret() string {
	if m.Provided != "" {
		return m.Provided
	}
	return plan.WorkerTLSSecret
}

// Ensure renews what is due and stores it; it returns when it next has something to do.
func (m *Manager) Ensure(ctx context.Context) (time.Time, error) {
	now := m.now()
	if m.Provided != "" {
		_, err := m.reload(ctx)
		return now.Add(maxSleep), err
	}
	caSec, err := m.get(ctx, plan.CASecret)
	if err != nil {
		return now, err
	}
	wSec, err := m.get(ctx, plan.WorkerTLSSecret)
	if err != nil {
		return now, err
	}
	st, err := loadState(ctx, caSec, wSec)
	if err != nil {
		return now.Add(maxSleep), err
	}
	st, next, err := Renew(st, m.Names, now, m.Life)
	if err != nil {
		return now, err
	}
	caData := map[string][]byte{KeyCert: st.CA.CertPEM, KeyKey: st.CA.KeyPEM}
	caNotes := map[string]string{}
	if st.Previous != nil {
		caData[keyPrevious], caData[keyPreviousKey] = st.Previous.CertPEM, st.Previous.KeyPEM
		caNotes[annotationRotated] = st.RotatedAt.UTC().Format(time.RFC3339)
	}
	bundle := Bundle(now, st.CA.Cert, st.Previous.cert())
	wData := map[string][]byte{KeyCert: st.Serving.CertPEM, KeyKey: st.Serving.KeyPEM, KeyCA: bundle}
	// The CA first: a serving certificate is never stored before the CA that signed it.
	if err := m.put(ctx, caSec, plan.CASecret, caData, caNotes); err != nil {
		return now, err
	}
	if err := m.put(ctx, wSec, plan.WorkerTLSSecret, wData, nil); err != nil {
		return now, err
	}
	return next, m.remember(bundle)
}

// loadState reads what the Secrets hold. A CA Secret that exists but holds no usable CA, while
// the workers have a certificate, is an error, not a reason to make a new CA: a new one would
// sign at once, and every client holding the current bundle would fail until its namespace's
// bundle is updated, while the workers' current certificate keeps serving meanwhile (it is not
// renewed until then). Deleting the Secret asks for a new CA. Without a workers' certificate
// nothing trusts the CA yet (e.g. an empty Secret made before the first start): it is replaced.
func loadState(ctx context.Context, caSec, wSec *corev1.Secret) (State, error) {
	var st State
	if caSec != nil {
		p, err := ParsePair(caSec.Data[KeyCert], caSec.Data[KeyKey])
		if err == nil && !p.Cert.IsCA {
			err = errors.New("the certificate is not a CA")
		}
		if err != nil && wSec == nil {
			log.FromContext(ctx).Info("the CA Secret holds no usable CA and no certificate was issued from it; making a new CA",
				"secret", plan.CASecret, "error", err)
		} else if err != nil {
			return st, fmt.Errorf("secret %s/%s holds no usable CA (%w): the workers keep their current certificate; "+
				"delete the Secret to make a new CA (clients then fail until their namespace's bundle is updated)",
				caSec.Namespace, caSec.Name, err)
		} else {
			st.CA = &p
			if prev, err := ParsePair(caSec.Data[keyPrevious], caSec.Data[keyPreviousKey]); err == nil {
				st.Previous = &prev
				st.RotatedAt = rotatedAt(ctx, caSec, p)
			}
		}
	}
	if wSec != nil {
		if p, err := ParsePair(wSec.Data[KeyCert], wSec.Data[KeyKey]); err == nil {
			st.Serving = &p
		}
	}
	return st, nil
}

// rotatedAt is when ca replaced the previous CA: the Secret's annotation, but never before ca
// was made (a CA replaced by hand under an old annotation), and without the annotation (lost or
// edited) when ca was made. Otherwise the previous CA's publication delay would end at once and
// the serving certificate move to a CA some clients do not know yet.
func rotatedAt(ctx context.Context, caSec *corev1.Secret, ca Pair) time.Time {
	made := ca.Cert.NotBefore.Add(backdate)
	t, err := time.Parse(time.RFC3339, caSec.Annotations[annotationRotated])
	if err != nil {
		log.FromContext(ctx).Info("the CA Secret does not say when the CA was rotated; using when the CA was made",
			"secret", plan.CASecret, "annotation", annotationRotated, "rotatedAt", made)
		return made
	}
	if t.Before(made) {
		return made
	}
	return t
}

func (m *Manager) get(ctx context.Context, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	err := m.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading secret %s/%s: %w", m.Namespace, name, err)
	}
	return s, nil
}

func labels() map[string]string {
	return map[string]string{plan.LabelPartOf: plan.PartOf, plan.LabelManagedBy: plan.ManagedBy, plan.LabelName: plan.PartOf}
}

// put writes data to the Secret (cur, nil when it does not exist) when it differs.
func (m *Manager) put(ctx context.Context, cur *corev1.Secret, name string, data map[string][]byte, notes map[string]string) error {
	if cur == nil {
		return m.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.Namespace, Labels: labels(), Annotations: notes},
			Type:       corev1.SecretTypeTLS,
			Data:       data,
		})
	}
	if sameData(cur.Data, data) && cur.Annotations[annotationRotated] == notes[annotationRotated] {
		return nil
	}
	cur.Data = data
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	delete(cur.Annotations, annotationRotated)
	for k, v := range notes {
		cur.Annotations[k] = v
	}
	// Update, not patch: the resourceVersion makes a concurrent writer (a second replica
	// during a leader change) fail instead of both writing.
	return m.Client.Update(ctx, cur)
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if string(a[k]) != string(v) {
			return false
		}
	}
	return true
}

func (m *Manager) remember(bundle []byte) error {
	roots, err := Roots(bundle)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bundle, m.roots, m.read = bundle, roots, m.now()
	return nil
}

// ErrNotIssued: the workers' certificate is not there yet (the operator just started, or the
// Secret tls.secret names is missing or has no ca.crt yet).
var ErrNotIssued = errors.New("the workers' TLS certificate is not issued yet")

// ErrBadBundle: the workers' Secret holds a ca.crt that does not parse.
var ErrBadBundle = errors.New("the workers' CA bundle is unusable")

// reload reads the bundle from the workers' Secret.
func (m *Manager) reload(ctx context.Context) ([]byte, error) {
	s, err := m.get(ctx, m.WorkerSecret())
	if err != nil {
		return nil, err
	}
	if s == nil || len(s.Data[KeyCA]) == 0 {
		return nil, fmt.Errorf("%w: secret %s/%s has no %s", ErrNotIssued, m.Namespace, m.WorkerSecret(), KeyCA)
	}
	if err := m.remember(s.Data[KeyCA]); err != nil {
		return nil, fmt.Errorf("%w: secret %s/%s, %s: %w", ErrBadBundle, m.Namespace, m.WorkerSecret(), KeyCA, err)
	}
	return s.Data[KeyCA], nil
}

// Bundle is the PEM of the CAs a client of the workers trusts.
func (m *Manager) Bundle(ctx context.Context) ([]byte, error) {
	m.mu.Lock()
	b, fresh := m.bundle, m.now().Sub(m.read) < bundleTTL
	m.mu.Unlock()
	if b != nil && fresh {
		return b, nil
	}
	return m.reload(ctx)
}

// Roots is Bundle as a pool.
func (m *Manager) Roots(ctx context.Context) (*x509.CertPool, error) {
	if _, err := m.Bundle(ctx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.roots, nil
}

// EnsureNamespace gives namespace ns the ConfigMap revault-ca (key ca.crt) that its Job pods
// mount to trust the workers.
func (m *Manager) EnsureNamespace(ctx context.Context, ns string) error {
	bundle, err := m.Bundle(ctx)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	err = m.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.CAConfigMap}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return m.Client.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: plan.CAConfigMap, Namespace: ns, Labels: labels()},
			Data:       map[string]string{KeyCA: string(bundle)},
		})
	case err != nil:
		return err
	case cm.Data[KeyCA] == string(bundle):
		return nil
	}
	cm.Data = map[string]string{KeyCA: string(bundle)}
	return m.Client.Update(ctx, cm)
}
