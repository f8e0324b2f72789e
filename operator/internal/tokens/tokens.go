// Package tokens manages the workers' bearer tokens.
//
// The source of truth is one Secret in the operator's namespace, revault-worker-tokens, whose
// key "tokens" is the workers' token file: one "TOKEN SCOPE" per line, where SCOPE is "*" for
// the operator's own (unscoped) token and a namespace for every other token. Worker pods mount
// it and reload it when the kubelet updates the file. Each namespace that has a BackupSeries or
// RestoreJob gets a copy of its own token in the Secret revault-token (key "token"), which the
// Job pods of that namespace mount; a token scoped to one namespace cannot see another's series.
package tokens

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

// AdminScope is the scope of the operator's unscoped token.
const AdminScope = "*"

// Entry is one line of the token file.
type Entry struct {
	Token string
	Scope string
}

// Parse reads a token file. Blank lines and lines starting with '#' are skipped.
func Parse(s string) ([]Entry, error) {
	var out []Entry
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("token file line %d: want \"TOKEN SCOPE\", got %d fields", i+1, len(f))
		}
		out = append(out, Entry{Token: f[0], Scope: f[1]})
	}
	return out, nil
}

// Format writes a token file: the admin token first, then namespaces in order, so the same set
// of tokens always gives the same bytes (and the Secret is not rewritten needlessly).
func Format(entries []Entry) string {
	es := append([]Entry(nil), entries...)
	sort.SliceStable(es, func(i, j int) bool {
		ai, aj := es[i].Scope == AdminScope, es[j].Scope == AdminScope
		if ai != aj {
			return ai
		}
		return es[i].Scope < es[j].Scope
	})
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.Token)
		b.WriteByte(' ')
		b.WriteString(e.Scope)
		b.WriteByte('\n')
	}
	return b.String()
}

// Lookup returns the token of a scope.
func Lookup(entries []Entry, scope string) (string, bool) {
	for _, e := range entries {
		if e.Scope == scope {
			return e.Token, true
		}
	}
	return "", false
}

// Generate returns a new random token (256 bits, hex).
func Generate() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Manager keeps the token Secrets. Reads go to the API server directly (Reader), never to a
// cache: a token must never be issued twice for a namespace because a cache was behind.
type Manager struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
	mu        sync.Mutex
}

func labels() map[string]string {
	return map[string]string{
		plan.LabelPartOf:    plan.PartOf,
		plan.LabelManagedBy: plan.ManagedBy,
		plan.LabelName:      plan.PartOf,
		plan.LabelToken:     "true",
	}
}

// workerFiles is what the workers' token Secret holds: the token file and the quota file
// (revault serve --quota-file; empty when no namespace has a quota).
type workerFiles struct {
	entries []Entry
	quotas  string
}

// update applies fn to the worker Secret's files and writes them back when they changed,
// creating the Secret (with a new admin token) when it does not exist. Both keys are always
// written, so every worker's --quota-file exists.
func (m *Manager) update(ctx context.Context, fn func(*workerFiles) error) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var result []Entry
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		sec := &corev1.Secret{}
		key := types.NamespacedName{Namespace: m.Namespace, Name: plan.WorkerTokensSecret}
		err := m.Reader.Get(ctx, key, sec)
		create := apierrors.IsNotFound(err)
		if err != nil && !create {
			return err
		}
		entries, err := Parse(string(sec.Data[plan.WorkerTokensKey]))
		if err != nil {
			return fmt.Errorf("secret %s/%s: %w", m.Namespace, plan.WorkerTokensSecret, err)
		}
		if _, ok := Lookup(entries, AdminScope); !ok {
			t, err := Generate()
			if err != nil {
				return err
			}
			entries = append(entries, Entry{Token: t, Scope: AdminScope})
		}
		files := workerFiles{entries: entries, quotas: string(sec.Data[plan.WorkerQuotasKey])}
		if err := fn(&files); err != nil {
			return err
		}
		result = files.entries
		data := map[string][]byte{
			plan.WorkerTokensKey: []byte(Format(files.entries)),
			plan.WorkerQuotasKey: []byte(files.quotas),
		}
		if create {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: plan.WorkerTokensSecret, Namespace: m.Namespace, Labels: labels()},
				Type:       corev1.SecretTypeOpaque,
				Data:       data,
			}
			return m.Client.Create(ctx, sec)
		}
		if holds(sec.Data, data) {
			return nil
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		maps.Copy(sec.Data, data)
		return m.Client.Update(ctx, sec)
	})
	return result, err
}

// holds says whether have has every key of want, with the same bytes.
func holds(have, want map[string][]byte) bool {
	for k, v := range want {
		if old, ok := have[k]; !ok || !bytes.Equal(old, v) {
			return false
		}
	}
	return true
}

// EnsureWorkerSecret makes sure the worker token Secret exists and holds an admin token.
func (m *Manager) EnsureWorkerSecret(ctx context.Context) error {
	_, err := m.update(ctx, func(*workerFiles) error { return nil })
	return err
}

// AdminToken returns the operator's own token, creating it if needed.
func (m *Manager) AdminToken(ctx context.Context) (string, error) {
	entries, err := m.update(ctx, func(*workerFiles) error { return nil })
	if err != nil {
		return "", err
	}
	t, _ := Lookup(entries, AdminScope)
	return t, nil
}

// EnsureNamespace gives namespace ns a scoped token: an entry in the worker token file and the
// Secret revault-token in ns that its Job pods mount.
func (m *Manager) EnsureNamespace(ctx context.Context, ns string) error {
	entries, err := m.update(ctx, func(f *workerFiles) error {
		if _, ok := Lookup(f.entries, ns); ok {
			return nil
		}
		t, err := Generate()
		if err != nil {
			return err
		}
		f.entries = append(f.entries, Entry{Token: t, Scope: ns})
		return nil
	})
	if err != nil {
		return err
	}
	token, _ := Lookup(entries, ns)
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		sec := &corev1.Secret{}
		err := m.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: plan.NamespaceTokenSecret}, sec)
		if apierrors.IsNotFound(err) {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: plan.NamespaceTokenSecret, Namespace: ns, Labels: labels()},
				Type:       corev1.SecretTypeOpaque,
				Data:       map[string][]byte{plan.NamespaceTokenKey: []byte(token)},
			}
			return m.Client.Create(ctx, sec)
		}
		if err != nil {
			return err
		}
		if string(sec.Data[plan.NamespaceTokenKey]) == token {
			return nil
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[plan.NamespaceTokenKey] = []byte(token)
		return m.Client.Update(ctx, sec)
	})
}

// NamespaceToken returns the token of namespace ns (false if it has none yet).
func (m *Manager) NamespaceToken(ctx context.Context, ns string) (string, bool, error) {
	sec := &corev1.Secret{}
	err := m.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: plan.WorkerTokensSecret}, sec)
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	entries, err := Parse(string(sec.Data[plan.WorkerTokensKey]))
	if err != nil {
		return "", false, err
	}
	t, ok := Lookup(entries, ns)
	return t, ok, nil
}

// Prune revokes the tokens of namespaces that no longer exist, and writes the workers' quota
// file from the revault.io/quota annotations of those that do (an annotation that does not
// parse is left out, and reported in invalid: the series of that namespace say so too).
func (m *Manager) Prune(ctx context.Context) (removed []string, invalid map[string]error, err error) {
	_, err = m.update(ctx, func(f *workerFiles) error {
		removed, invalid = removed[:0], map[string]error{}
		quotas := map[string]int64{}
		keep := f.entries[:0:0]
		for _, x := range f.entries {
			if x.Scope != AdminScope {
				ns := &corev1.Namespace{}
				err := m.Reader.Get(ctx, types.NamespacedName{Name: x.Scope}, ns)
				if apierrors.IsNotFound(err) {
					removed = append(removed, x.Scope)
					continue
				}
				if err != nil {
					return err
				}
				if v, ok := ns.Annotations[backupv1alpha1.QuotaAnnotation]; ok {
					if q, err := plan.ParseQuota(v); err != nil {
						invalid[x.Scope] = err
					} else {
						quotas[x.Scope] = q
					}
				}
			}
			keep = append(keep, x)
		}
		f.entries, f.quotas = keep, plan.QuotaFile(quotas)
		return nil
	})
	return removed, invalid, err
}
