// Package worker is the plugin's client of the Revault worker API (worker/api/openapi.yaml): the
// object namespace that backs Velero's backup storage location, and version expiry.
package worker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Client talks to one worker with one bearer token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
	// PageSize is how many entries List asks for per page (default 1000).
	PageSize int
}

// TLSOptions configure HTTPS to a worker.
type TLSOptions struct {
	// CACertFile is a PEM bundle to trust (a private CA).
	CACertFile string
	// InsecureSkipVerify accepts any certificate.
	InsecureSkipVerify bool
}

// New returns a client for baseURL. Bodies stream, so there is no overall timeout; connecting
// and waiting for a response head are bounded.
func New(baseURL, token string, t TLSOptions) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("worker URL %q: want http(s)://HOST[:PORT]", baseURL)
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 10 * time.Minute,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		// Objects are gzip files themselves: never ask for (or undo) transfer compression.
		DisableCompression: true,
	}
	if t.CACertFile != "" || t.InsecureSkipVerify {
		cfg := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // an explicit opt-in
		if t.CACertFile != "" {
			pem, err := os.ReadFile(t.CACertFile)
			if err != nil {
				return nil, fmt.Errorf("reading the worker CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s holds no PEM certificate", t.CACertFile)
			}
			cfg.RootCAs = pool
		}
		tr.TLSClientConfig = cfg
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Transport: tr}}, nil
}

// Error is an error answer of the worker: {"code", "message"} with an HTTP status.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("revault worker: %s (%d %s)", e.Message, e.Status, e.Code)
}

// IsNotFound reports whether err is the worker's 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// Object is what the worker knows about an object.
type Object struct {
	Key           string    `json:"key"`
	Size          int64     `json:"size"`
	Encoding      string    `json:"encoding"`
	UploadedBytes int64     `json:"uploadedBytes"`
	ETag          string    `json:"etag"`
	Version       int64     `json:"version"`
	Time          time.Time `json:"time"`
	TarMembers    int64     `json:"tarMembers"`
	NewBytes      int64     `json:"newBytes"`
	StoredBytes   int64     `json:"storedBytes"`
}

// Listing is one page of GET …/objects.
type Listing struct {
	Objects        []Object `json:"objects"`
	CommonPrefixes []string `json:"commonPrefixes"`
	NextStartAfter string   `json:"nextStartAfter"`
}

func bucketPath(ns, bucket string) string {
	return "/v1/buckets/" + url.PathEscape(ns) + "/" + url.PathEscape(bucket)
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.BaseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

// send runs req and turns error answers into *Error; the caller closes a successful body.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("revault worker %s: %w", c.BaseURL, err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{Status: resp.StatusCode}
	var p struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &p) == nil && p.Message != "" {
		e.Code, e.Message = p.Code, p.Message
	} else {
		e.Message = fmt.Sprintf("%s %s answered %s: %s", req.Method, req.URL.Path, resp.Status, strings.TrimSpace(string(raw)))
	}
	return nil, e
}

func (c *Client) json(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// PutObject streams body into ns/bucket under key. gzip: body is a gzip stream the worker
// stores decompressed (so it deduplicates) and serves compressed again.
func (c *Client) PutObject(ctx context.Context, ns, bucket, key string, body io.Reader, gzip bool) (*Object, error) {
	q := url.Values{"key": {key}}
	if gzip {
		q.Set("encoding", "gzip")
	}
	req, err := c.request(ctx, http.MethodPut, bucketPath(ns, bucket)+"/object", q, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var o Object
	return &o, json.NewDecoder(resp.Body).Decode(&o)
}

// GetObject returns the object's body as uploaded; the caller closes it.
func (c *Client) GetObject(ctx context.Context, ns, bucket, key string) (io.ReadCloser, error) {
	req, err := c.request(ctx, http.MethodGet, bucketPath(ns, bucket)+"/object", url.Values{"key": {key}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ObjectMeta returns what the bucket knows about key (a 404 *Error when it does not exist).
func (c *Client) ObjectMeta(ctx context.Context, ns, bucket, key string) (*Object, error) {
	var o Object
	return &o, c.json(ctx, http.MethodGet, bucketPath(ns, bucket)+"/object/meta", url.Values{"key": {key}}, nil, &o)
}

// DeleteObject deletes key (a 404 *Error when it does not exist).
func (c *Client) DeleteObject(ctx context.Context, ns, bucket, key string) error {
	return c.json(ctx, http.MethodDelete, bucketPath(ns, bucket)+"/object", url.Values{"key": {key}}, nil, nil)
}

// List returns every object under prefix and, with a delimiter, the common prefixes, walking
// all pages.
func (c *Client) List(ctx context.Context, ns, bucket, prefix, delimiter string) ([]Object, []string, error) {
	var objects []Object
	var prefixes []string
	after := ""
	for {
		size := c.PageSize
		if size <= 0 {
			size = 1000
		}
		q := url.Values{"prefix": {prefix}, "limit": {strconv.Itoa(size)}}
		if delimiter != "" {
			q.Set("delimiter", delimiter)
		}
		if after != "" {
			q.Set("startAfter", after)
		}
		var page Listing
		if err := c.json(ctx, http.MethodGet, bucketPath(ns, bucket)+"/objects", q, nil, &page); err != nil {
			return nil, nil, err
		}
		objects = append(objects, page.Objects...)
		prefixes = append(prefixes, page.CommonPrefixes...)
		if page.NextStartAfter == "" {
			return objects, prefixes, nil
		}
		after = page.NextStartAfter
	}
}

// SignURL returns a path and query, relative to the worker, that reads key without a token
// until it expires.
func (c *Client) SignURL(ctx context.Context, ns, bucket, key string, ttl time.Duration) (string, error) {
	secs := int64(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	var out struct {
		URL string `json:"url"`
	}
	err := c.json(ctx, http.MethodPost, bucketPath(ns, bucket)+"/signed-url", nil,
		map[string]any{"key": key, "ttlSeconds": secs}, &out)
	return out.URL, err
}

// ExpireVersion deletes one version of a series (its unique data is freed).
func (c *Client) ExpireVersion(ctx context.Context, ns, series string, version int64) error {
	path := "/v1/series/" + url.PathEscape(ns) + "/" + url.PathEscape(series) + "/versions/" + strconv.FormatInt(version, 10)
	return c.json(ctx, http.MethodDelete, path, nil, nil, nil)
}
