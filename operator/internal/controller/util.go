package controller

import (
	"fmt"
	"strings"
)

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
