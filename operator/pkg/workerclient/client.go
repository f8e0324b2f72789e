// Package workerclient is the Go client of the Revault worker API (worker/api/openapi.yaml),
// shared by the operator and the Velero plugin.
//
// zz_generated.client.go is generated from the spec by oapi-codegen (make generate-client; a
// stale file fails make lint-operator). This file adds what a generator cannot know: the bearer
// token, the worker's error answers as Go errors (*APIError), a size limit on JSON answers, and an
// HTTP client for streaming bodies. Callers use the generated methods:
//
//	c, err := workerclient.New(url, token, nil)
//	s, err := workerclient.JSON(c.GetSeriesWithResponse(ctx, ns, name))
//
// A method without "WithResponse" (GetObject, GetVersion, PutObjectWithBody, ...) hands over the
// *http.Response unread, so a body streams in either direction; the caller closes it.
package workerclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// MaxJSONBytes bounds a JSON answer the client reads (a listing page of 10000 objects is a few
// MiB), so a confused server cannot exhaust the caller's memory.
const MaxJSONBytes = 64 << 20

// maxErrorBytes bounds what is read of an error answer.
const maxErrorBytes = 64 << 10

// New returns a client of the worker at baseURL (http(s)://HOST[:PORT]) that sends token (none
// when empty) with every request, through hc (nil: a client with a 60 s timeout, for metadata
// calls; StreamingHTTPClient's for bodies). An error answer comes back as an *APIError.
func New(baseURL, token string, hc *http.Client) (*ClientWithResponses, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("worker URL %q: want http(s)://HOST[:PORT]", baseURL)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	opts := []ClientOption{WithHTTPClient(answers{hc})}
	if token != "" {
		opts = append(opts, WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	return NewClientWithResponses(strings.TrimRight(baseURL, "/"), opts...)
}

// APIError is an error answer of the worker: its HTTP status and its {"code", "message"} body.
type APIError struct {
	Status  int
	Code    ErrorCode
	Message string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return e.Message
	}
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// status is err's HTTP status when it is the worker's error answer, else 0.
func status(err error) int {
	var e *APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports whether err is the worker's 404.
func IsNotFound(err error) bool { return status(err) == http.StatusNotFound }

// IsConflict reports whether err is the worker's 409 (another writer holds the series).
func IsConflict(err error) bool { return status(err) == http.StatusConflict }

// IsUnauthorized reports whether err is the worker's 401 (it does not know the token).
func IsUnauthorized(err error) bool { return status(err) == http.StatusUnauthorized }

// HasCode reports whether err is the worker's error answer with this code.
func HasCode(err error, code ErrorCode) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == code
}

// ErrNoBody is a success answer without the JSON body the spec gives it.
var ErrNoBody = errors.New("the worker's answer has no JSON body")

// JSON is the body of a call's 200 answer: JSON(c.GetSeriesWithResponse(ctx, ns, name)).
func JSON[T any, R interface{ GetJSON200() *T }](r R, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	if b := r.GetJSON200(); b != nil {
		return b, nil
	}
	return nil, ErrNoBody
}

// Created is the body of a call's 201 answer (an object put).
func Created[T any, R interface{ GetJSON201() *T }](r R, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	if b := r.GetJSON201(); b != nil {
		return b, nil
	}
	return nil, ErrNoBody
}

// Done is the error of a call whose answer's body is not needed (200 and 201 alike).
func Done[R any](_ R, err error) error { return err }

// answers sends requests through an http.Client and turns the worker's error answers into
// *APIError, so every generated method returns them as its error; success answers in JSON are
// read at most MaxJSONBytes.
type answers struct{ hc *http.Client }

func (a answers) Do(req *http.Request) (*http.Response, error) {
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", req.URL.Host, err)
	}
	if resp.StatusCode >= 300 {
		defer func() { _ = resp.Body.Close() }()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		return nil, answerError(req, resp, raw)
	}
	if isJSON(resp.Header.Get("Content-Type")) {
		resp.Body = limitedBody{io.LimitReader(resp.Body, MaxJSONBytes), resp.Body}
	}
	return resp, nil
}

// answerError is the error of an answer with status >= 300: the worker's {code, message}, or, for
// a body that is not one (a proxy's page), what came back.
func answerError(req *http.Request, resp *http.Response, raw []byte) *APIError {
	e := &APIError{Status: resp.StatusCode}
	var body Error
	if json.Unmarshal(raw, &body) == nil && body.Message != "" {
		e.Code, e.Message = body.Code, body.Message
		return e
	}
	e.Message = fmt.Sprintf("%s %s answered %s: %s", req.Method, req.URL.Path, resp.Status,
		strings.TrimSpace(string(raw)))
	return e
}

func isJSON(contentType string) bool {
	t, _, err := mime.ParseMediaType(contentType)
	return err == nil && t == "application/json"
}

// limitedBody reads through a limit and closes the response's body.
type limitedBody struct {
	io.Reader
	io.Closer
}

// TLSOptions configure HTTPS to a worker.
type TLSOptions struct {
	// CACertFile is a PEM bundle to trust (a private CA).
	CACertFile string
	// CACert is a PEM bundle to trust, in memory (e.g. the operator's, from a namespace's
	// ConfigMap revault-ca); used when CACertFile is empty.
	CACert []byte
	// InsecureSkipVerify accepts any certificate.
	InsecureSkipVerify bool
}

// StreamingHTTPClient is an HTTP client for calls whose bodies stream (object puts and gets,
// backups, restores): no overall timeout, but connecting and waiting for an answer's head are
// bounded; transfer compression is never asked for (objects are gzip files themselves).
func StreamingHTTPClient(t TLSOptions) (*http.Client, error) {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 10 * time.Minute,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
	}
	if t.CACertFile != "" || len(t.CACert) > 0 || t.InsecureSkipVerify {
		cfg := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // an explicit opt-in
		pem, from := t.CACert, "the worker CA bundle"
		if t.CACertFile != "" {
			var err error
			if pem, err = os.ReadFile(t.CACertFile); err != nil {
				return nil, fmt.Errorf("reading the worker CA: %w", err)
			}
			from = t.CACertFile
		}
		if len(pem) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s holds no PEM certificate", from)
			}
			cfg.RootCAs = pool
		}
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Transport: tr}, nil
}
