package objectstore

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
	"github.com/revault-io/revault/velero-plugin/internal/testutil"
)

// objectMeta is what the worker knows about key in velero's bucket b.
func objectMeta(t *testing.T, w *testutil.Worker, b, key string) (*workerclient.Object, error) {
	t.Helper()
	c, err := workerclient.New(w.URL, w.Tokens["velero"], nil)
	if err != nil {
		t.Fatal(err)
	}
	return workerclient.JSON(c.GetObjectMetaWithResponse(context.Background(), "velero", b,
		&workerclient.GetObjectMetaParams{Key: key}))
}

// veleroTarball is a tar like Velero's backup contents: one JSON file per resource.
func veleroTarball(t *testing.T, n int, mtime time.Time) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < n; i++ {
		body := []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d","namespace":"app"},"data":{"k":"%s"}}`,
			i, strings.Repeat(fmt.Sprintf("value-%d-", i), 200)))
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("resources/configmaps/namespaces/app/cm-%d.json", i),
			Size: int64(len(body)), Mode: 0o755, ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func newStore(t *testing.T, w *testutil.Worker, extra map[string]string) *ObjectStore {
	t.Helper()
	cfg := map[string]string{KeyURL: w.URL, KeyNamespace: "velero", keyCredentialsFile: w.TokenFile(t, "velero"),
		keyBucket: "default", keyPrefix: ""}
	for k, v := range extra {
		cfg[k] = v
	}
	o := New(logrus.New())
	if err := o.Init(cfg); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return o
}

func TestObjectStoreAgainstAWorker(t *testing.T) {
	w := testutil.StartWorker(t, "velero", "team-b")
	o := newStore(t, w, map[string]string{KeyPublicURL: "https://revault.example.com:8443"})
	b := "default"

	// Init refuses what it does not know.
	if err := New(logrus.New()).Init(map[string]string{KeyURL: w.URL, "region": "eu"}); err == nil ||
		!strings.Contains(err.Error(), "unknown config keys [region]") {
		t.Fatalf("unknown keys: %v", err)
	}
	if err := New(logrus.New()).Init(map[string]string{KeyURL: w.URL, KeyTokenFile: "/nonexistent"}); err == nil ||
		!strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("a missing token file is an error: %v", err)
	}

	// A gzip tarball, a gzip log and a plain JSON file, as Velero writes them.
	tarball := veleroTarball(t, 50, time.Unix(1_767_225_600, 0))
	logs := []byte(strings.Repeat("time=2026-01-01 level=info msg=\"backed up item\"\n", 500))
	meta := []byte(`{"kind":"Backup","apiVersion":"velero.io/v1","metadata":{"name":"b1"}}`)
	puts := map[string][]byte{
		"backups/b1/b1.tar.gz":           testutil.Gzip(t, tarball),
		"backups/b1/b1-logs.gz":          testutil.Gzip(t, logs),
		"backups/b1/velero-backup.json":  meta,
		"backups/b2/velero-backup.json":  meta,
		"restores/r1/restore-r1-logs.gz": testutil.Gzip(t, logs),
	}
	for k, v := range puts {
		if err := o.PutObject(b, k, bytes.NewReader(v)); err != nil {
			t.Fatalf("PutObject %s: %v", k, err)
		}
	}
	m, err := objectMeta(t, w, b, "backups/b1/b1.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if m.Encoding != "gzip" || m.Size != int64(len(tarball)) || m.TarMembers != 50 {
		t.Fatalf("the tarball is stored decompressed and split per member: %+v", m)
	}
	if m, err := objectMeta(t, w, b, "backups/b1/velero-backup.json"); err != nil || m.Encoding != "identity" {
		t.Fatalf("plain objects are stored as they are: %+v, %v", m, err)
	}

	// Reads: gzip objects come back as gzip of the same content, others byte-exact.
	r, err := o.GetObject(b, "backups/b1/b1.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.Gunzip(t, r); !bytes.Equal(got, tarball) {
		t.Fatal("the tarball's content differs")
	}
	_ = r.Close()
	r, err = o.GetObject(b, "backups/b1/velero-backup.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(r); !bytes.Equal(got, meta) {
		t.Fatalf("got %q", got)
	}
	_ = r.Close()
	if _, err := o.GetObject(b, "backups/nope"); !workerclient.IsNotFound(err) {
		t.Fatalf("missing object: %v", err)
	}

	for k, want := range map[string]bool{"backups/b1/b1-logs.gz": true, "backups/b1/nothing": false} {
		if got, err := o.ObjectExists(b, k); err != nil || got != want {
			t.Fatalf("ObjectExists(%s) = %v, %v", k, got, err)
		}
	}
	prefixes, err := o.ListCommonPrefixes(b, "", "/")
	if err != nil || strings.Join(prefixes, ",") != "backups/,restores/" {
		t.Fatalf("top level: %v %v", prefixes, err)
	}
	prefixes, err = o.ListCommonPrefixes(b, "backups/", "/")
	if err != nil || strings.Join(prefixes, ",") != "backups/b1/,backups/b2/" {
		t.Fatalf("backups: %v %v", prefixes, err)
	}
	keys, err := o.ListObjects(b, "backups/b1/")
	if err != nil || strings.Join(keys, ",") != "backups/b1/b1-logs.gz,backups/b1/b1.tar.gz,backups/b1/velero-backup.json" {
		t.Fatalf("objects: %v %v", keys, err)
	}
	// Listings longer than a page are walked to their end.
	o.pageSize = 1
	prefixes, err = o.ListCommonPrefixes(b, "", "/")
	if err != nil || strings.Join(prefixes, ",") != "backups/,restores/" {
		t.Fatalf("paged prefixes: %v %v", prefixes, err)
	}
	keys, err = o.ListObjects(b, "backups/")
	if err != nil || len(keys) != 4 || keys[0] != "backups/b1/b1-logs.gz" || keys[3] != "backups/b2/velero-backup.json" {
		t.Fatalf("paged objects: %v %v", keys, err)
	}
	o.pageSize = pageSize

	// Signed URLs: readable without a token, rewritten to the public address.
	u, err := o.CreateSignedURL(b, "backups/b1/b1-logs.gz", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(u, "https://revault.example.com:8443/v1/signed/velero/default?") {
		t.Fatalf("public URL: %s", u)
	}
	direct := w.URL + strings.TrimPrefix(u, "https://revault.example.com:8443")
	resp, err := http.Get(direct)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("signed GET: %s", resp.Status)
	}
	if got := testutil.Gunzip(t, resp.Body); !bytes.Equal(got, logs) {
		t.Fatal("the signed URL serves the log")
	}
	_ = resp.Body.Close()

	// Delete, twice: the second is not an error (S3 semantics).
	for i := 0; i < 2; i++ {
		if err := o.DeleteObject(b, "backups/b2/velero-backup.json"); err != nil {
			t.Fatalf("DeleteObject #%d: %v", i+1, err)
		}
	}
	if ok, _ := o.ObjectExists(b, "backups/b2/velero-backup.json"); ok {
		t.Fatal("deleted object still exists")
	}

	// Another namespace's token cannot use velero's bucket.
	other := New(logrus.New())
	if err := other.Init(map[string]string{KeyURL: w.URL, KeyNamespace: "velero", KeyTokenFile: w.TokenFile(t, "team-b")}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ListObjects(b, ""); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("scoped token: %v", err)
	}
}

func TestGzipTarballsDeduplicateAcrossBackups(t *testing.T) {
	w := testutil.StartWorker(t, "velero")
	o := newStore(t, w, nil)
	var first, second *workerclient.Object
	for i, key := range []string{"backups/d1/d1.tar.gz", "backups/d2/d2.tar.gz"} {
		// The same resources, backed up a day apart: every tar header differs (mtime).
		body := testutil.Gzip(t, veleroTarball(t, 300, time.Unix(1_767_225_600+int64(i)*86400, 0)))
		if err := o.PutObject("default", key, bytes.NewReader(body)); err != nil {
			t.Fatal(err)
		}
		m, err := objectMeta(t, w, "default", key)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = m
		} else {
			second = m
		}
	}
	added := map[int64]int64{}
	for _, v := range w.Versions(t, "velero", "default") {
		added[v.Number] = v.NewBytes
	}
	// The second tarball's new bytes are its tar headers, nothing else.
	if added[first.Version] < 300*2000 || added[second.Version] > 300*512+1024 {
		t.Fatalf("new bytes: first %d, second %d: the second should deduplicate", added[first.Version], added[second.Version])
	}
}

// Velero validates a backup storage location by listing it, before it has written anything: a
// bucket the worker does not have yet lists empty (the worker answers 200 with no objects), and
// comes into being with its first object.
func TestANewBucketListsEmpty(t *testing.T) {
	w := testutil.StartWorker(t, "velero")
	o := newStore(t, w, nil)
	prefixes, err := o.ListCommonPrefixes("fresh", "", "/")
	if err != nil || len(prefixes) != 0 {
		t.Fatalf("ListCommonPrefixes of a new bucket: %v, %v", prefixes, err)
	}
	keys, err := o.ListObjects("fresh", "backups/")
	if err != nil || len(keys) != 0 {
		t.Fatalf("ListObjects of a new bucket: %v, %v", keys, err)
	}
	if ok, err := o.ObjectExists("fresh", "backups/b1/velero-backup.json"); ok || err != nil {
		t.Fatalf("ObjectExists in a new bucket: %v, %v", ok, err)
	}
	if err := o.PutObject("fresh", "backups/b1/velero-backup.json", strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	}
	keys, err = o.ListObjects("fresh", "")
	if err != nil || strings.Join(keys, ",") != "backups/b1/velero-backup.json" {
		t.Fatalf("ListObjects after the first put: %v, %v", keys, err)
	}
}

func TestBucketsResolveThroughTheirBackupSeries(t *testing.T) {
	api := testutil.StartAPI(t)
	w := testutil.StartWorker(t, "velero")
	api.Namespace(t, "velero")

	// Without url: the token comes from the namespace's Secret, the worker from the BackupSeries.
	o := New(logrus.New())
	if err := o.Init(map[string]string{KeyNamespace: "velero"}); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("no Secret yet: %v", err)
	}
	api.TokenSecret(t, "velero", w.Tokens["velero"])
	if err := o.Init(map[string]string{KeyNamespace: "velero"}); err != nil {
		t.Fatal(err)
	}
	if err := o.PutObject("default", "k", strings.NewReader("v")); err == nil || !strings.Contains(err.Error(), "BackupSeries velero/default") {
		t.Fatalf("no BackupSeries: %v", err)
	}
	placeBucket(t, api, "velero", "default", "")
	if err := o.PutObject("default", "k", strings.NewReader("v")); err == nil || !strings.Contains(err.Error(), "not placed") {
		t.Fatalf("not placed: %v", err)
	}
	placeBucket(t, api, "velero", "default", w.URL)
	if err := o.PutObject("default", "k", strings.NewReader("v")); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.ObjectExists("default", "k"); !ok || err != nil {
		t.Fatalf("ObjectExists: %v %v", ok, err)
	}
}

// A worker serving the operator's certificate, found through its BackupSeries, is trusted
// through the CA bundle the operator gives the namespace (ConfigMap revault-ca), with no CA in
// the BSL config; without that bundle the call fails on the certificate.
func TestTLSWorkersAreTrustedThroughTheNamespaceBundle(t *testing.T) {
	api := testutil.StartAPI(t)
	w := testutil.StartTLSWorker(t, "velero")
	api.Namespace(t, "velero")
	api.TokenSecret(t, "velero", w.Tokens["velero"])
	placeBucket(t, api, "velero", "default", w.URL)
	untrusted := New(logrus.New())
	if err := untrusted.Init(map[string]string{KeyNamespace: "velero"}); err != nil {
		t.Fatal(err)
	}
	if err := untrusted.PutObject("default", "k", strings.NewReader("v")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("no bundle: want a certificate error, got %v", err)
	}
	api.CABundle(t, "velero", w.CA)
	o := New(logrus.New())
	if err := o.Init(map[string]string{KeyNamespace: "velero"}); err != nil {
		t.Fatal(err)
	}
	if err := o.PutObject("default", "k", strings.NewReader("v")); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.ObjectExists("default", "k"); !ok || err != nil {
		t.Fatalf("ObjectExists: %v %v", ok, err)
	}
}

// placeBucket makes the BackupSeries of bucket in ns (an external source) if it does not exist,
// and places it on the worker at endpoint (unless empty), as the operator would.
func placeBucket(t *testing.T, api *testutil.API, ns, bucket, endpoint string) {
	t.Helper()
	ctx := context.Background()
	bs := &backupv1alpha1.BackupSeries{
		ObjectMeta: metav1.ObjectMeta{Name: bucket, Namespace: ns},
		Spec: backupv1alpha1.BackupSeriesSpec{
			Source: backupv1alpha1.BackupSource{External: &backupv1alpha1.ExternalSource{Producer: "velero"}},
		},
	}
	if err := api.Client.Get(ctx, client.ObjectKeyFromObject(bs), bs); apierrors.IsNotFound(err) {
		err = api.Client.Create(ctx, bs)
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if endpoint == "" {
		return
	}
	bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: backupv1alpha1.MediaSSD, Node: "n1", Endpoint: endpoint}
	if err := api.Client.Status().Update(ctx, bs); err != nil {
		t.Fatal(err)
	}
}

func TestTokenFiles(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ body, want, err string }{
		{"abc123\n", "abc123", ""},
		{"# the worker's token\n\ntoken= abc123 \n", "abc123", ""},
		{"token:abc123\n", "abc123", ""},
		{"token=\n", "", "no value"},
		{"# only a comment\n", "", "no token"},
	}
	for i, c := range cases {
		path := fmt.Sprintf("%s/t%d", dir, i)
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := readToken(path)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: want an error containing %q, got %q, %v", c.body, c.err, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: want %q, got %q, %v", c.body, c.want, got, err)
		}
	}
}
