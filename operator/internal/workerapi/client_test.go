package workerapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The client against a canned HTTP server: request shape (method, path, token, body) and the
// decoding of answers and errors. The real worker is exercised by the envtest suite.
func TestClient(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization")+" "+string(body))
		switch r.URL.Path {
		case "/v1/stats":
			_, _ = w.Write([]byte(`{"logical_bytes":100,"container_bytes":40,"versions":2,"dedup_ratio":2.5}`))
		case "/v1/series/ns/db":
			if r.Method == http.MethodDelete {
				_, _ = w.Write([]byte(`{"series":"ns/db","expired":[1,2],"bytes_freed":99}`))
				return
			}
			_, _ = w.Write([]byte(`{"series":"ns/db","unit":"segment","versions":1,"logicalBytes":5,
				"retention":{"keep":3,"keepWithinSeconds":null,"live":1,"auto":true},
				"versionList":[{"number":1,"time":"2025-01-02T03:04:05Z","kind":"tree","form":"live","logicalBytes":5,"newBytes":5,"storedBytes":3}]}`))
		case "/v1/series/ns/db/retention":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		case "/v1/series/ns/missing":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":"unknown_series","message":"no series ns/missing"}`))
		case "/v1/series/ns/busy/slide":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"code":"busy","message":"series ns/busy is being written"}`))
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("upstream trouble"))
		}
	}))
	defer srv.Close()
	c := New(srv.URL+"/", "tok", nil)
	ctx := context.Background()

	st, err := c.Stats(ctx)
	if err != nil || st.ContainerBytes != 40 || st.DedupRatio != 2.5 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	s, err := c.Series(ctx, "ns", "db")
	if err != nil || len(s.VersionList) != 1 || s.VersionList[0].StoredBytes != 3 || *s.Retention.Keep != 3 ||
		s.VersionList[0].Time.Year() != 2025 {
		t.Fatalf("Series = %+v, %v", s, err)
	}
	keep := int64(2)
	r, err := c.PutRetention(ctx, "ns", "db", Retention{Keep: &keep, Live: 1})
	if err != nil || *r.Keep != 2 || r.KeepWithinSeconds != nil {
		t.Fatalf("PutRetention = %+v, %v", r, err)
	}
	d, err := c.DeleteSeries(ctx, "ns", "db")
	if err != nil || d.BytesFreed != 99 || len(d.Expired) != 2 {
		t.Fatalf("DeleteSeries = %+v, %v", d, err)
	}
	_, err = c.Series(ctx, "ns", "missing")
	if !IsNotFound(err) || err.Error() != "no series ns/missing" {
		t.Fatalf("missing series: %v", err)
	}
	_, err = c.Slide(ctx, "ns", "busy")
	if !IsConflict(err) || IsNotFound(err) {
		t.Fatalf("busy series: %v", err)
	}
	_, err = c.ExpireByRetention(ctx, "ns", "other")
	if e, ok := err.(*Error); !ok || e.Status != 502 || e.Message != "worker answered 502 Bad Gateway to POST /v1/series/ns/other/expire: upstream trouble" {
		t.Fatalf("non-JSON error: %#v", err)
	}
	want := []string{
		"GET /v1/stats Bearer tok ",
		"GET /v1/series/ns/db Bearer tok ",
		`PUT /v1/series/ns/db/retention Bearer tok {"keep":2,"keepWithinSeconds":null,"live":1,"auto":false}`,
		"DELETE /v1/series/ns/db Bearer tok ",
		"GET /v1/series/ns/missing Bearer tok ",
		"POST /v1/series/ns/busy/slide Bearer tok ",
		`POST /v1/series/ns/other/expire Bearer tok {"applyRetention":true}`,
	}
	if len(seen) != len(want) {
		t.Fatalf("requests %q", seen)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d = %q, want %q", i, seen[i], want[i])
		}
	}
	if _, err := New("http://127.0.0.1:1", "t", nil).Stats(ctx); err == nil {
		t.Errorf("an unreachable worker gave no error")
	}
}
