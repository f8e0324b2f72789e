package workerclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The generated client and this package's additions against a canned HTTP server: what goes on
// the wire (method, path, query, token, body), what comes back decoded, and error answers as
// *APIError. The real worker is exercised by the operator's envtest suite and the plugin's tests.
func TestClient(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, strings.TrimSpace(r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery+" "+
			r.Header.Get("Authorization")+" "+string(body)))
		js := func(status int, s string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(s))
		}
		switch r.URL.Path {
		case "/v1/series/ns/db":
			js(200, `{"series":"ns/db","unit":"segment","versions":2,"latest":2,"latestTime":"2025-01-02T03:04:05Z",
				"logicalBytes":5,"retention":{"keep":1,"keepWithinSeconds":null,"live":1,"auto":false},
				"versionList":[{"number":1,"time":"2025-01-01T03:04:05Z","kind":"tree","form":"live","logicalBytes":5,"newBytes":5,"storedBytes":3,"chunks":1},
				               {"number":2,"time":"2025-01-02T03:04:05Z","kind":"tree","form":"live","logicalBytes":5,"newBytes":0,"storedBytes":0,"chunks":1}],
				"pendingExpiry":[1]}`)
		case "/v1/series/ns/db/retention":
			js(201, string(body))
		case "/v1/series/ns/db/expire":
			js(200, `{"series":"ns/db","expired":[1],"spliced":[],"unitsFreed":1,"containersFreed":1,"bytesFreed":99,"logicalBytesExpired":5,"seconds":0.1}`)
		case "/v1/series/ns/missing":
			js(404, `{"code":"unknown_series","message":"no series ns/missing"}`)
		case "/v1/buckets/velero/bsl/object":
			w.Header().Set("Content-Type", "application/gzip")
			_, _ = w.Write([]byte("\x1f\x8bcontent"))
		case "/v1/buckets/velero/none/objects":
			js(404, `{"code":"unknown_bucket","message":"no bucket velero/none"}`)
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("upstream trouble"))
		}
	}))
	defer srv.Close()
	c, err := New(srv.URL+"/", "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	s, err := JSON(c.GetSeriesWithResponse(ctx, "ns", "db"))
	if err != nil || len(s.VersionList) != 2 || s.VersionList[0].StoredBytes != 3 || *s.Retention.Keep != 1 ||
		s.VersionList[1].Time.Day() != 2 || len(s.PendingExpiry) != 1 || s.PendingExpiry[0] != 1 {
		t.Fatalf("GetSeries = %+v, %v", s, err)
	}
	keep, live := int64(2), int64(1)
	if err := Done(c.PutRetentionWithResponse(ctx, "ns", "db", Retention{Keep: &keep, Live: &live})); err != nil {
		t.Fatalf("PutRetention (201): %v", err)
	}
	var byRetention ExpireRequest
	if err := byRetention.FromExpireByRetention(ExpireByRetention{ApplyRetention: true}); err != nil {
		t.Fatal(err)
	}
	e, err := JSON(c.ExpireVersionsWithResponse(ctx, "ns", "db", byRetention))
	if err != nil || e.BytesFreed != 99 || len(e.Expired) != 1 {
		t.Fatalf("ExpireVersions = %+v, %v", e, err)
	}

	_, err = JSON(c.GetSeriesWithResponse(ctx, "ns", "missing"))
	if !IsNotFound(err) || !HasCode(err, ErrorCodeUnknownSeries) || IsConflict(err) ||
		err.Error() != "no series ns/missing (404 unknown_series)" {
		t.Fatalf("missing series: %v", err)
	}
	limit := 2
	_, err = JSON(c.ListObjectsWithResponse(ctx, "velero", "none", &ListObjectsParams{Limit: &limit}))
	if !HasCode(err, ErrorCodeUnknownBucket) {
		t.Fatalf("missing bucket: %v", err)
	}
	err = Done(c.SlideSeriesWithResponse(ctx, "ns", "other"))
	if e, ok := err.(*APIError); !ok || e.Status != 502 || e.Code != "" ||
		e.Error() != "POST /v1/series/ns/other/slide answered 502 Bad Gateway: upstream trouble" {
		t.Fatalf("an answer that is not the worker's error: %#v", err)
	}

	// A body streams: the plain method hands over the response unread.
	resp, err := c.GetObject(ctx, "velero", "bsl", &GetObjectParams{Key: "backups/a b.gz"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(got) != "\x1f\x8bcontent" {
		t.Fatalf("GetObject body %q", got)
	}

	want := []string{
		"GET /v1/series/ns/db? Bearer tok",
		`PUT /v1/series/ns/db/retention? Bearer tok {"keep":2,"live":1}`,
		`POST /v1/series/ns/db/expire? Bearer tok {"applyRetention":true}`,
		"GET /v1/series/ns/missing? Bearer tok",
		"GET /v1/buckets/velero/none/objects?limit=2 Bearer tok",
		"POST /v1/series/ns/other/slide? Bearer tok",
		"GET /v1/buckets/velero/bsl/object?key=backups%2Fa+b.gz Bearer tok",
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}

	if _, err := New("localhost:8420", "t", nil); err == nil {
		t.Errorf("a URL without a scheme was taken")
	}
	unreachable, _ := New("http://127.0.0.1:1", "", nil)
	if _, err := JSON(unreachable.GetStatsWithResponse(ctx)); err == nil || status(err) != 0 {
		t.Errorf("an unreachable worker: %v", err)
	}
}

// A JSON answer larger than MaxJSONBytes is cut, not read whole.
func TestJSONAnswersAreBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"url":"`))
		chunk := []byte(strings.Repeat("x", 1<<20))
		for i := 0; i < MaxJSONBytes>>20+1; i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`","expiresAt":"2026-01-01T00:00:00Z"}`))
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "", nil)
	_, err := JSON(c.SignObjectUrlWithResponse(context.Background(), "velero", "bsl", SignRequest{Key: "k"}))
	if err == nil {
		t.Fatalf("an answer over %d bytes was decoded", MaxJSONBytes)
	}
}
