// Package testutil runs what the plugin's tests talk to: a real `revault serve` on loopback
// ($REVAULT_BIN) and a real kube-apiserver + etcd with the operator's CRDs (envtest,
// $KUBEBUILDER_ASSETS from hack/k8s-binaries.sh).
package testutil

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/revault-io/revault/velero-plugin/internal/kube"
)

// Worker is a running `revault serve`.
type Worker struct {
	URL   string
	Admin string
	// Tokens maps namespaces to their scoped tokens.
	Tokens map[string]string
	Dir    string
	// CA is the PEM certificate a client of a TLS worker trusts (nil without TLS).
	CA   []byte
	cmd  *exec.Cmd
	http *http.Client
}

type pemPair struct{ cert, key []byte }

// selfSigned makes a self-signed certificate for localhost.
func selfSigned(t testing.TB) *pemPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		// A self-signed leaf, not a CA: rustls (the revault CLI) refuses a CA certificate
		// used as a server's own.
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &pemPair{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StartWorker runs a worker with an admin token and one scoped token per namespace.
func StartWorker(t testing.TB, namespaces ...string) *Worker {
	t.Helper()
	return startWorker(t, nil, namespaces)
}

// StartTLSWorker is StartWorker serving HTTPS at https://localhost:PORT with a certificate of
// a CA of its own, whose PEM is in CA.
func StartTLSWorker(t testing.TB, namespaces ...string) *Worker {
	t.Helper()
	return startWorker(t, selfSigned(t), namespaces)
}

func startWorker(t testing.TB, tlsPair *pemPair, namespaces []string) *Worker {
	t.Helper()
	bin := os.Getenv("REVAULT_BIN")
	if bin == "" {
		t.Fatal("REVAULT_BIN must name the revault binary (make build; make test-velero sets it)")
	}
	dir := t.TempDir()
	w := &Worker{Admin: token(), Tokens: map[string]string{}, Dir: dir}
	lines := w.Admin + " *\n"
	for _, ns := range namespaces {
		w.Tokens[ns] = token()
		lines += w.Tokens[ns] + " " + ns + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "addr")
	args := []string{"serve", "--store", filepath.Join(dir, "store"), "--init", "--listen", "127.0.0.1:0",
		"--addr-file", addrFile, "--token-file", filepath.Join(dir, "tokens"), "--maintenance-interval", "0"}
	scheme, probe := "http://", http.DefaultClient
	if tlsPair != nil {
		cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if os.WriteFile(cert, tlsPair.cert, 0o600) != nil || os.WriteFile(key, tlsPair.key, 0o600) != nil {
			t.Fatal("writing the worker's certificate")
		}
		args = append(args, "--tls-cert", cert, "--tls-key", key)
		w.CA = tlsPair.cert
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(w.CA)
		scheme, probe = "https://", &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	}
	w.http = probe
	w.cmd = exec.Command(bin, args...)
	w.cmd.Stdout, w.cmd.Stderr = log, log
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = w.cmd.Process.Kill()
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil {
			addr := strings.TrimSpace(string(b))
			if tlsPair != nil {
				addr = strings.Replace(addr, "127.0.0.1", "localhost", 1)
			}
			w.URL = scheme + addr
			if r, err := probe.Get(w.URL + "/readyz"); err == nil {
				_ = r.Body.Close()
				if r.StatusCode == 200 {
					return w
				}
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			t.Fatalf("revault serve did not become ready:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TokenFile writes a namespace's token to a file and returns its path.
func (w *Worker) TokenFile(t testing.TB, ns string) string {
	t.Helper()
	p := filepath.Join(w.Dir, "token-"+ns)
	if err := os.WriteFile(p, []byte(w.Tokens[ns]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Push backs up dir (or a file) as the next version of ns/series with the namespace's token:
// what a backup Job does. It returns the push's JSON report.
func (w *Worker) Push(t testing.TB, ns, series, path string) string {
	t.Helper()
	args := []string{"--json", "--quiet", "push", "--server", w.URL, "--token-file", w.TokenFile(t, ns)}
	if w.CA != nil {
		ca := filepath.Join(w.Dir, "ca.crt")
		if err := os.WriteFile(ca, w.CA, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--ca-cert", ca)
	}
	out, err := exec.Command(os.Getenv("REVAULT_BIN"), append(args, "--series", ns+"/"+series, path)...).CombinedOutput()
	if err != nil {
		t.Fatalf("revault push: %v\n%s", err, out)
	}
	return string(out)
}

// Version is one version of a series, as the worker lists it.
type Version struct {
	Number   int64 `json:"number"`
	NewBytes int64 `json:"newBytes"`
}

// Versions lists the versions of ns/series on the worker (admin token).
func (w *Worker) Versions(t testing.TB, ns, series string) []Version {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, w.URL+"/v1/series/"+ns+"/"+series+"/versions", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.Admin)
	resp, err := w.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("listing the versions of %s/%s: %s: %s", ns, series, resp.Status, b)
	}
	var vs []Version
	if err := json.NewDecoder(resp.Body).Decode(&vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

// Gzip compresses b.
func Gzip(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Gunzip reads the gzip stream r to its end.
func Gunzip(t testing.TB, r io.Reader) []byte {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// API is a running envtest control plane with the operator's CRDs.
type API struct {
	Client     client.Client
	Kubeconfig string
}

// StartAPI starts envtest with the CRDs of config/crd/bases and points the plugin's
// Kubernetes client (kube.Client) at it.
func StartAPI(t testing.TB) *API {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS must name the envtest binaries: export KUBEBUILDER_ASSETS=$(hack/k8s-binaries.sh envtest | tail -1)")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	kube.Use(c)
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "velero", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return &API{Client: c, Kubeconfig: path}
}

// Namespace creates a namespace (if needed).
func (a *API) Namespace(t testing.TB, name string) {
	t.Helper()
	err := a.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TokenSecret writes the namespace's revault-token Secret, as the operator does.
func (a *API) TokenSecret(t testing.TB, ns, token string) {
	t.Helper()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: kube.TokenSecret, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/part-of": "revault", "revault.io/token": "true"}},
		Data: map[string][]byte{kube.TokenKey: []byte(token)},
	}
	if err := a.Client.Create(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
}

// CABundle writes the ConfigMap the operator gives a namespace with the workers' CA bundle.
func (a *API) CABundle(t testing.TB, ns string, pem []byte) {
	t.Helper()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: kube.CAConfigMap, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/part-of": "revault"}},
		Data: map[string]string{kube.CAKey: string(pem)},
	}
	if err := a.Client.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
}

// Eventually polls f until it returns nil (bounded).
func Eventually(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
