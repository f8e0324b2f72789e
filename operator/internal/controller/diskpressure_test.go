package controller

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// A series says when its worker is nearly full (True, a warning, the worker's room in the
// message), says so no more once room is freed, and keeps what it said while the worker does
// not answer or does not report its room.
func TestDiskPressureFollowsTheWorkersRoom(t *testing.T) {
	free := int64(4 << 30) // of 100 GiB
	broken := false
	degraded := `null`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/stats" {
			http.NotFound(w, req)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if broken {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = fmt.Fprint(w, `{"error":"internal","message":"statvfs failed"}`)
			return
		}
		_, _ = fmt.Fprintf(w, `{"series":1,"versions":1,"chunks":1,"containers":1,"containerBytes":10,"logicalBytes":10,`+
			`"disk":{"dataTotalBytes":%d,"dataFreeBytes":%d,"metaTotalBytes":%d,"metaFreeBytes":%d},"degraded":%s}`,
			int64(100<<30), free, int64(100<<30), int64(50<<30), degraded)
	}))
	defer srv.Close()
	c, err := workerclient.New(srv.URL, "t", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	api := &instrumented{c: c, at: (&Workers{}).callsTo(srv.URL)}
	rec := record.NewFakeRecorder(10)
	bs := &backupv1alpha1.BackupSeries{}
	bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: backupv1alpha1.MediaSSD, Node: "n1"}
	cs := conditionSetter{rec: rec, obj: bs, conds: &bs.Status.Conditions}
	r := &BackupSeriesReconciler{MinFreePercent: 10}
	cond := func() *metav1.Condition {
		return apimeta.FindStatusCondition(bs.Status.Conditions, backupv1alpha1.ConditionDiskPressure)
	}

	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "WorkerNearlyFull" ||
		!strings.Contains(c.Message, "on node n1 has 4% free for containers of 100.0 GiB (new series need 10%)") {
		t.Fatalf("4%% free: condition %+v", c)
	}
	if e := <-rec.Events; !strings.HasPrefix(e, "Warning WorkerNearlyFull DiskPressure is True") {
		t.Fatalf("event %q", e)
	}

	broken = true
	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("a worker that fails its stats call changed the condition: %+v", c)
	}

	broken, free = false, 30<<30
	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "WorkerHasRoom" ||
		!strings.Contains(c.Message, "30.0 GiB free of 100.0 GiB") {
		t.Fatalf("30%% free: condition %+v", c)
	}
	if e := <-rec.Events; !strings.HasPrefix(e, "Normal WorkerHasRoom DiskPressure is False") {
		t.Fatalf("event %q", e)
	}

	// With the check off (--min-free-percent=0) the condition says nothing either way.
	r.MinFreePercent, free = 0, 0
	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c != nil {
		t.Fatalf("check off: condition %+v", c)
	}

	// A store degraded by a full disk is said even with the check off: it takes no new series
	// and no backups (it stays ready, serving restores), and only room on its disk helps.
	degraded = `"a synced write to the metadata failed"`
	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "has a degraded store (a synced write to the metadata failed)") ||
		!strings.Contains(c.Message, "restores still work") || strings.Contains(c.Message, "expire") {
		t.Fatalf("degraded: condition %+v", c)
	}
	degraded = `null`
	r.setDiskPressure(context.Background(), api, &bs.Status, cs)
	if c := cond(); c != nil {
		t.Fatalf("no longer degraded, check off: condition %+v", c)
	}
}
