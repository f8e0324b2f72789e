package plan

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// ParseQuota reads the revault.io/quota annotation of a Namespace: a Kubernetes quantity of
// whole bytes ("500Gi", "2T", "1.5Ki"), zero or more, below 8Ei.
func ParseQuota(v string) (int64, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a quantity of bytes (e.g. 500Gi): %w", backupv1alpha1.QuotaAnnotation, v, err)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%s %q is negative", backupv1alpha1.QuotaAnnotation, v)
	}
	// Value() rounds a fraction up and wraps what does not fit in 64 bits: only a value that
	// is exactly what it reads is taken.
	n := q.Value()
	if n < 0 || resource.NewQuantity(n, resource.BinarySI).Cmp(q) != 0 {
		return 0, fmt.Errorf("%s %q is not a whole number of bytes below 8Ei", backupv1alpha1.QuotaAnnotation, v)
	}
	return n, nil
}

// QuotaFile is the workers' quota file (revault serve --quota-file): "NAMESPACE BYTES" per
// line, in namespace order, so the same quotas always give the same bytes.
func QuotaFile(quotas map[string]int64) string {
	names := make([]string, 0, len(quotas))
	for ns := range quotas {
		names = append(names, ns)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, ns := range names {
		fmt.Fprintf(&b, "%s %d\n", ns, quotas[ns])
	}
	return b.String()
}

// NamespaceUse is what a namespace is charged against its quota: the logical bytes of every
// version of its series, as their statuses report them. The workers charge the same sum, each
// for the series it holds, object buckets included.
func NamespaceUse(series []backupv1alpha1.BackupSeries) int64 {
	var total int64
	for i := range series {
		total += series[i].Status.LogicalBytes
	}
	return total
}
