package tokens

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
)

func TestParseFormat(t *testing.T) {
	in := "# worker tokens\n\nbbb team-b\naaa *\n  ccc   team-a  \n"
	es, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{{"bbb", "team-b"}, {"aaa", "*"}, {"ccc", "team-a"}}
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("Parse = %v, want %v", es, want)
	}
	if got := Format(es); got != "aaa *\nccc team-a\nbbb team-b\n" {
		t.Fatalf("Format = %q (admin first, then by namespace)", got)
	}
	if tok, ok := Lookup(es, "team-a"); !ok || tok != "ccc" {
		t.Errorf("Lookup team-a = %q, %v", tok, ok)
	}
	if _, ok := Lookup(es, "team-c"); ok {
		t.Errorf("Lookup of a missing namespace succeeded")
	}
	if _, err := Parse("lonelytoken\n"); err == nil {
		t.Errorf("a line without scope was accepted")
	}
	if _, err := Parse("a b c\n"); err == nil {
		t.Errorf("a line with three fields was accepted")
	}
}

func TestGenerate(t *testing.T) {
	a, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate()
	if len(a) != 64 || a == b {
		t.Fatalf("tokens %q %q: want 64 hex characters, different each time", a, b)
	}
}

// The worker Secret always carries a quota file, even one made before quotas existed, and
// Prune writes it from the namespaces' revault.io/quota: a value that does not parse is left
// out and reported, a namespace that is gone loses its token and its line.
func TestPruneWritesTheQuotaFile(t *testing.T) {
	ctx := context.Background()
	ns := func(name, quota string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if quota != "" {
			n.Annotations = map[string]string{backupv1alpha1.QuotaAnnotation: quota}
		}
		return n
	}
	old := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: plan.WorkerTokensSecret, Namespace: "sys"},
		Data:       map[string][]byte{plan.WorkerTokensKey: []byte("adm *\nta team-a\ntb team-b\ntc team-c\ngone gone\n")},
	}
	c := fake.NewClientBuilder().WithObjects(old, ns("team-a", "1Ki"), ns("team-b", "lots"), ns("team-c", "")).Build()
	m := &Manager{Client: c, Reader: c, Namespace: "sys"}
	quotaFile := func() (string, bool) {
		sec := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: plan.WorkerTokensSecret}, sec); err != nil {
			t.Fatal(err)
		}
		q, ok := sec.Data[plan.WorkerQuotasKey]
		return string(q), ok
	}
	if err := m.EnsureWorkerSecret(ctx); err != nil {
		t.Fatal(err)
	}
	if q, ok := quotaFile(); !ok || q != "" {
		t.Fatalf("after EnsureWorkerSecret: quotas %q (present %v), want an empty file", q, ok)
	}
	removed, invalid, err := m.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(removed, []string{"gone"}) {
		t.Errorf("removed %v", removed)
	}
	if _, ok := invalid["team-b"]; !ok || len(invalid) != 1 {
		t.Errorf("invalid %v, want team-b's", invalid)
	}
	if q, _ := quotaFile(); q != "team-a 1024\n" {
		t.Errorf("quota file %q, want team-a's line only", q)
	}
}
