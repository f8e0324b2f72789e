package controller

import (
	"strings"
	"testing"

	"github.com/revault-io/revault/operator/internal/plan"
)

// A series nothing can take says why: no worker at all, none reachable, or every one nearly
// full (then the condition's reason is NoSpace and the message names each worker's room).
func TestNoWorkerReasonAndMessage(t *testing.T) {
	full := func(node string) plan.Candidate {
		return plan.Candidate{Node: node, Reachable: true,
			Room: &plan.Room{DataTotal: 100 << 30, DataFree: 3 << 30, MetaTotal: 100 << 30, MetaFree: 3 << 30, MinFreePercent: 10}}
	}
	cands := []plan.Candidate{full("n1"), full("n2"), {Node: "n3"}}
	problems := []string{"n1: " + cands[0].NearlyFull(), "n2: " + cands[1].NearlyFull(), "n3: connection refused"}
	if got := noWorkerReason(cands); got != "NoSpace" {
		t.Fatalf("reason %q, want NoSpace", got)
	}
	msg := noWorkerMessage("ssd", cands, problems)
	for _, want := range []string{"every ssd worker is nearly full", "n1: 3% free for containers of 100.0 GiB", "n3: connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	unreachable := []plan.Candidate{{Node: "n3"}}
	if got := noWorkerReason(unreachable); got != "NoWorker" {
		t.Fatalf("reason %q for an unreachable worker, want NoWorker", got)
	}
	if got := noWorkerMessage("hdd", nil, nil); !strings.Contains(got, "no ready hdd worker") {
		t.Fatalf("message %q", got)
	}
}
