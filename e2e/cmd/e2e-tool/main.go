// Command e2e-tool is what the e2e suite runs inside the cluster (image revault.local/e2e-tool):
// it fills a volume with a generated file tree, changes part of it, checksums a tree, and calls
// the worker API with a namespace's token. Every command prints its result as one JSON line
// prefixed with "RESULT: " (package toolresult; the suite reads it from the pod's log).
//
//	e2e-tool gen    -dir D -seed N -files N -bytes B   generate a tree (random file contents)
//	e2e-tool mutate -dir D -seed N -rewrite K -add B   rewrite K files, add one, delete one
//	e2e-tool sum    -dir D                             manifest of every entry and its digest
//	e2e-tool api    -server URL -token-file F -req "METHOD PATH" ...
package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/revault-io/revault/e2e/internal/toolresult"
)

func main() {
	if len(os.Args) < 2 {
		fatal(errors.New("usage: e2e-tool gen|mutate|sum|api|slowpush|readback [flags]"))
	}
	var res any
	var err error
	switch os.Args[1] {
	case "gen":
		res, err = gen(os.Args[2:])
	case "mutate":
		res, err = mutate(os.Args[2:])
	case "sum":
		res, err = sum(os.Args[2:])
	case "api":
		res, err = api(os.Args[2:])
	case "slowpush":
		res, err = slowPush(os.Args[2:])
	case "readback":
		res, err = readBackCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("%s%s\n", toolresult.Prefix, b)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "e2e-tool:", err)
	os.Exit(1)
}

// writeRandom writes n bytes from a ChaCha8 stream seeded by (seed, salt): incompressible, and
// the same bytes for the same seed.
func writeRandom(path string, n int64, seed, salt uint64, mode os.FileMode) error {
	var key [32]byte
	for i := 0; i < 8; i++ {
		key[i] = byte(seed >> (8 * i))
		key[8+i] = byte(salt >> (8 * i))
	}
	src := rand.NewChaCha8(key)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	// On an error the file is incomplete either way: that error is the one to report, not
	// what closing it says.
	if _, err := io.CopyN(f, src, n); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil { // umask-proof
		_ = f.Close()
		return err
	}
	return f.Close()
}

// gen writes a tree under dir: `files` random files spread over nested directories with sizes
// summing to about `bytes`, plus what a restore must get right besides contents: an empty
// file, an empty directory, a compressible text file, a relative symlink, an executable, a
// private file owned by another user (when run as root) and a fixed old mtime.
func gen(args []string) (any, error) {
	fl := flag.NewFlagSet("gen", flag.ExitOnError)
	dir := fl.String("dir", "/data", "target directory")
	seed := fl.Uint64("seed", 1, "seed")
	files := fl.Int("files", 16, "number of random files")
	total := fl.Int64("bytes", 32<<20, "approximate total size of the random files")
	_ = fl.Parse(args)
	// Sizes: random weights scaled to the total, from a fixed stream: they depend on -files and
	// -bytes only, so a tree's layout (and how much a mutate changes) is the same whatever the
	// seed of its contents.
	r := rand.New(rand.NewPCG(0x1a7, 0x5eed))
	res := toolresult.Gen{}
	w := make([]float64, *files)
	sumW := 0.0
	for i := range w {
		w[i] = 0.25 + r.Float64()
		sumW += w[i]
	}
	for i := 0; i < *files; i++ {
		sub := filepath.Join(*dir, fmt.Sprintf("d%d", i%4), fmt.Sprintf("e%d", i%3))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return nil, err
		}
		n := int64(float64(*total) * w[i] / sumW)
		if err := writeRandom(filepath.Join(sub, fmt.Sprintf("f%03d.bin", i)), n, *seed, uint64(i), 0o644); err != nil {
			return nil, err
		}
		res.Files++
		res.Bytes += n
	}
	var text bytes.Buffer
	for i := 0; text.Len() < 256<<10; i++ {
		fmt.Fprintf(&text, "line %d of a compressible text file, seed %d\n", i, *seed)
	}
	extra := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"README.txt", text.Bytes(), 0o644},
		{"empty", nil, 0o644},
		{"bin/run.sh", []byte("#!/bin/sh\necho restored\n"), 0o755},
		{"private/secret.key", []byte("not really a key\n"), 0o600},
	}
	for _, e := range extra {
		p := filepath.Join(*dir, e.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, e.data, e.mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(p, e.mode); err != nil {
			return nil, err
		}
		res.Files++
		res.Bytes += int64(len(e.data))
	}
	if err := os.MkdirAll(filepath.Join(*dir, "empty-dir"), 0o750); err != nil {
		return nil, err
	}
	if err := os.Symlink("../README.txt", filepath.Join(*dir, "bin", "readme")); err != nil {
		return nil, err
	}
	old := time.Date(2020, 2, 29, 12, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(*dir, "README.txt"), old, old); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(*dir, "private", "secret.key"), 1234, 2345); err != nil {
			return nil, err
		}
		if err := os.Chown(filepath.Join(*dir, "private"), 1234, 2345); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// mutate changes part of a tree made by gen: the first `rewrite` random files (in path order)
// get new random contents of the same size, one new random file of `add` bytes appears, and the
// empty file is deleted.
func mutate(args []string) (any, error) {
	fl := flag.NewFlagSet("mutate", flag.ExitOnError)
	dir := fl.String("dir", "/data", "tree to change")
	seed := fl.Uint64("seed", 2, "seed of the new contents")
	rewrite := fl.Int("rewrite", 2, "files to rewrite")
	add := fl.Int64("add", 1<<20, "size of the added file")
	_ = fl.Parse(args)
	var bins []string
	err := filepath.WalkDir(*dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(p, ".bin") {
			bins = append(bins, p)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(bins)
	if len(bins) < *rewrite {
		return nil, fmt.Errorf("only %d files to rewrite", len(bins))
	}
	res := toolresult.Mutate{}
	for i, p := range bins[:*rewrite] {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if err := writeRandom(p, st.Size(), *seed, uint64(1000+i), 0o644); err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(*dir, p)
		res.Rewritten = append(res.Rewritten, rel)
		res.RewrittenBytes += st.Size()
	}
	if err := writeRandom(filepath.Join(*dir, "d0", "added.bin"), *add, *seed, 9999, 0o644); err != nil {
		return nil, err
	}
	res.AddedBytes = *add
	// A second mutate of the same tree finds it already removed (scenario 12 mutates twice).
	switch err := os.Remove(filepath.Join(*dir, "empty")); {
	case err == nil:
		res.Removed = "empty"
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	return res, nil
}

// sum describes every entry below dir (not dir itself) as one line: type, path, permission
// bits, owner, and for files size, mtime and SHA-256 of the contents, for symlinks the target.
// Directory mtimes are left out (creating entries changes them). Digest covers all lines.
func sum(args []string) (any, error) {
	fl := flag.NewFlagSet("sum", flag.ExitOnError)
	dir := fl.String("dir", "/data", "tree")
	_ = fl.Parse(args)
	res := toolresult.Sum{}
	err := filepath.WalkDir(*dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == *dir {
			return err
		}
		rel, _ := filepath.Rel(*dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", p)
		}
		head := fmt.Sprintf("%s mode=%04o uid=%d gid=%d", rel, fi.Mode().Perm()|fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), st.Uid, st.Gid)
		var line string
		switch {
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			n, err := io.Copy(h, f)
			_ = f.Close() // read only: the read's error is what counts
			if err != nil {
				return err
			}
			res.Bytes += n
			line = fmt.Sprintf("f %s size=%d mtime=%d sha256=%s", head, n, fi.ModTime().Unix(), hex.EncodeToString(h.Sum(nil)))
		case fi.IsDir():
			line = "d " + head
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line = fmt.Sprintf("l %s -> %s", head, t)
		default:
			line = fmt.Sprintf("o %s type=%s", head, fi.Mode().Type())
		}
		res.Lines = append(res.Lines, line)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(res.Lines)
	h := sha256.New()
	for _, l := range res.Lines {
		h.Write([]byte(l + "\n"))
	}
	res.Entries = len(res.Lines)
	res.Digest = hex.EncodeToString(h.Sum(nil))
	return res, nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// api sends each request ("METHOD PATH") to the worker with the token from token-file and
// records the status, the error code of a JSON error body, and the start of the body. PUT and
// POST send a small octet-stream body.
func api(args []string) (any, error) {
	fl := flag.NewFlagSet("api", flag.ExitOnError)
	w := addWorkerFlags(fl)
	var reqs multiFlag
	fl.Var(&reqs, "req", `"METHOD PATH" (repeatable)`)
	_ = fl.Parse(args)
	token, err := w.token()
	if err != nil {
		return nil, err
	}
	cl, err := workerHTTP(*w.server, *w.caFile, 60*time.Second)
	if err != nil {
		return nil, err
	}
	var out []toolresult.APICall
	for _, r := range reqs {
		method, path, ok := strings.Cut(r, " ")
		if !ok {
			return nil, fmt.Errorf("bad -req %q", r)
		}
		var body io.Reader
		if method == http.MethodPut || method == http.MethodPost {
			body = strings.NewReader("e2e probe data\n")
		}
		req, err := http.NewRequest(method, strings.TrimRight(*w.server, "/")+path, body)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if body != nil {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		resp, err := cl.Do(req)
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close() // what was read is recorded; closing cannot change it
		call := toolresult.APICall{Request: r, Status: resp.StatusCode, Body: string(b)}
		var e struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(b, &e) == nil {
			call.Code = e.Code
		}
		out = append(out, call)
	}
	return out, nil
}

// workerFlags are the flags of every command that calls a worker.
type workerFlags struct{ server, tokenFile, caFile *string }

func addWorkerFlags(fl *flag.FlagSet) workerFlags {
	return workerFlags{
		server:    fl.String("server", "", "worker URL"),
		tokenFile: fl.String("token-file", "/etc/revault/token", "bearer token file"),
		caFile:    fl.String("ca-file", "/etc/revault/ca.crt", "CA bundle of the workers' certificate (https URLs)"),
	}
}

// token is the bearer token in -token-file.
func (w workerFlags) token() (string, error) {
	tok, err := os.ReadFile(*w.tokenFile)
	return strings.TrimSpace(string(tok)), err
}

// workerHTTP is a client of the worker at server: for https, one trusting only the CA bundle in
// caFile, on connections of its own.
func workerHTTP(server, caFile string, timeout time.Duration) (*http.Client, error) {
	cl := &http.Client{Timeout: timeout}
	if !strings.HasPrefix(server, "https://") {
		return cl, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no certificate", caFile)
	}
	cl.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	return cl, nil
}

// pacedReader yields n random bytes (seeded) at about rate bytes per second, hashing them.
type pacedReader struct {
	src   io.Reader
	left  int64
	rate  float64
	sent  int64
	start time.Time
	hash  hash.Hash
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	// Never ahead of the pace: wait until the bytes sent so far are due.
	if due := p.start.Add(time.Duration(float64(p.sent) / p.rate * float64(time.Second))); time.Now().Before(due) {
		time.Sleep(time.Until(due))
	}
	b = b[:min(int64(len(b)), p.left, 64<<10)]
	n, err := p.src.Read(b)
	p.hash.Write(b[:n])
	p.left -= int64(n)
	p.sent += int64(n)
	return n, err
}

// slowPush backs up -bytes random bytes as the next version of -series, sent at an even pace over
// -seconds on one connection, then reads the version back on a new connection: a backup that
// spans something happening to the worker (a certificate rotated) and a read after it.
func slowPush(args []string) (any, error) {
	fl := flag.NewFlagSet("slowpush", flag.ExitOnError)
	w := addWorkerFlags(fl)
	series := fl.String("series", "", "NS/NAME")
	size := fl.Int64("bytes", 8<<20, "bytes to send")
	seconds := fl.Float64("seconds", 30, "how long sending takes")
	seed := fl.Uint64("seed", 1, "content seed")
	_ = fl.Parse(args)
	token, err := w.token()
	if err != nil {
		return nil, err
	}
	base := strings.TrimRight(*w.server, "/") + "/v1/series/" + *series + "/versions"
	var key [32]byte
	for i := 0; i < 8; i++ {
		key[i] = byte(*seed >> (8 * i))
	}
	body := &pacedReader{src: rand.NewChaCha8(key), left: *size, rate: float64(*size) / *seconds, start: time.Now(), hash: sha256.New()}
	up, err := workerHTTP(*w.server, *w.caFile, 0)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPut, base, body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := up.Do(req)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close() // what was read is recorded; closing cannot change it
	out := toolresult.SlowPush{Status: resp.StatusCode, Body: string(b), Bytes: body.sent,
		Seconds: time.Since(body.start).Seconds(), Sent: hex.EncodeToString(body.hash.Sum(nil)),
		Answered: time.Now().UTC().Format(time.RFC3339Nano)}
	var rep struct {
		Version int64 `json:"version"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &rep) != nil {
		return out, nil
	}
	out.Version = rep.Version
	down, err := workerHTTP(*w.server, *w.caFile, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	out.Restored, out.ReadTries, err = readBack(down, fmt.Sprintf("%s/%d", base, rep.Version), token)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readBackCmd reads a version of a series and gives its SHA-256.
func readBackCmd(args []string) (any, error) {
	fl := flag.NewFlagSet("readback", flag.ExitOnError)
	w := addWorkerFlags(fl)
	series := fl.String("series", "", "NS/NAME")
	version := fl.Int64("version", 1, "version number")
	_ = fl.Parse(args)
	token, err := w.token()
	if err != nil {
		return nil, err
	}
	cl, err := workerHTTP(*w.server, *w.caFile, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("%s/v1/series/%s/versions/%d", strings.TrimRight(*w.server, "/"), *series, *version)
	sum, tries, err := readBack(cl, url, token)
	if err != nil {
		return nil, err
	}
	return toolresult.ReadBack{Version: *version, Restored: sum, Tries: tries}, nil
}

// readBack returns the SHA-256 of a version and how many tries it took. A worker that commits
// a backup while it shuts down (an upgrade rolls it) is out of its Service until its next pod
// is ready, so a refused connection or a 502/503 is tried again, for up to 3 minutes, as a
// client reading back its backup would.
func readBack(cl *http.Client, url, token string) (string, int, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for try := 1; ; try++ {
		sum, retry, err := readOnce(cl, url, token)
		if err == nil || !retry || time.Now().After(deadline) {
			return sum, try, err
		}
		time.Sleep(2 * time.Second)
	}
}

// readOnce reads url once; retry says whether the failure is one a restarting worker gives.
func readOnce(cl *http.Client, url, token string) (sum string, retry bool, err error) {
	get, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", false, err
	}
	get.Header.Set("Authorization", "Bearer "+token)
	gr, err := cl.Do(get)
	if err != nil {
		return "", true, err
	}
	defer func() { _ = gr.Body.Close() }()
	if gr.StatusCode != http.StatusOK {
		busy := gr.StatusCode == http.StatusBadGateway || gr.StatusCode == http.StatusServiceUnavailable
		return "", busy, fmt.Errorf("GET %s: %s", url, gr.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(h, gr.Body); err != nil {
		return "", true, err
	}
	return hex.EncodeToString(h.Sum(nil)), false, nil
}
