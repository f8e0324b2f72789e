package plan

import (
	"strings"
	"testing"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

func TestParseQuota(t *testing.T) {
	for in, want := range map[string]int64{"500Gi": 500 << 30, "2T": 2e12, " 1024 ": 1024, "0": 0, "1.5Ki": 1536} {
		got, err := ParseQuota(in)
		if err != nil || got != want {
			t.Errorf("ParseQuota(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{"lots": "is not a quantity of bytes", "-1Gi": "is negative", "": "is not a quantity",
		"10E": "below 8Ei", "99999999999999999999": "below 8Ei", "100m": "not a whole number", "0.5": "not a whole number"} {
		if _, err := ParseQuota(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseQuota(%q): %v, want an error saying %q", in, err, want)
		}
	}
}

func TestQuotaFileAndUse(t *testing.T) {
	if got, want := QuotaFile(map[string]int64{"team-b": 5, "team-a": 1 << 30}), "team-a 1073741824\nteam-b 5\n"; got != want {
		t.Errorf("QuotaFile = %q, want %q", got, want)
	}
	if got := QuotaFile(nil); got != "" {
		t.Errorf("no quotas: %q", got)
	}
	s := []backupv1alpha1.BackupSeries{{}, {}}
	s[0].Status.LogicalBytes, s[1].Status.LogicalBytes = 100, 23
	if got := NamespaceUse(s); got != 123 {
		t.Errorf("NamespaceUse = %d", got)
	}
}
