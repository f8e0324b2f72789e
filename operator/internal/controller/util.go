package controller

import (
	"fmt"
	"strings"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func apimetaFind(conds []metav1.Condition, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(conds, typ)
}

func apimetaRemove(conds *[]metav1.Condition, typ string) {
	apimeta.RemoveStatusCondition(conds, typ)
}

// joinMax joins at most n items, saying how many more there were.
func joinMax(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
