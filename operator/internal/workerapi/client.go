// Package workerapi is the operator's client for the worker HTTP API
// (worker/api/openapi.yaml): the metadata calls only; data flows between Job pods and workers.
package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one worker with the operator's admin token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

// New returns a client for baseURL (e.g. http://revault-worker-ssd-node1.revault-system.svc:8420).
func New(baseURL, token string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: httpClient}
}

// Error is an error answer of the worker: {"code": ..., "message": ...} with an HTTP status.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("worker answered %d %s", e.Status, e.Code)
}

// IsNotFound reports whether err is the worker's 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// IsConflict reports whether err is the worker's 409 (another writer holds the series).
func IsConflict(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusConflict
}

// Stats are the store totals of GET /v1/stats.
type Stats struct {
	LogicalBytes   int64   `json:"logical_bytes"`
	Versions       int64   `json:"versions"`
	UnitVBytes     int64   `json:"unit_vbytes"`
	ContainerBytes int64   `json:"container_bytes"`
	Containers     int64   `json:"containers"`
	DedupRatio     float64 `json:"dedup_ratio"`
}

// Retention is a series' retention (PUT /v1/series/{ns}/{name}/retention).
type Retention struct {
	Keep              *int64 `json:"keep"`
	KeepWithinSeconds *int64 `json:"keepWithinSeconds"`
	Live              int64  `json:"live"`
	Auto              bool   `json:"auto"`
}

// Version is one version of a series.
type Version struct {
	Number       int64     `json:"number"`
	Time         time.Time `json:"time"`
	Kind         string    `json:"kind"`
	Form         string    `json:"form"`
	LogicalBytes int64     `json:"logicalBytes"`
	NewBytes     int64     `json:"newBytes"`
	StoredBytes  int64     `json:"storedBytes"`
	Chunks       int64     `json:"chunks"`
}

// Series is GET /v1/series/{ns}/{name}.
type Series struct {
	Series       string     `json:"series"`
	Unit         string     `json:"unit"`
	Versions     int64      `json:"versions"`
	Latest       *int64     `json:"latest"`
	LatestTime   *time.Time `json:"latestTime"`
	LogicalBytes int64      `json:"logicalBytes"`
	Retention    *Retention `json:"retention"`
	VersionList  []Version  `json:"versionList"`
}

// SlideReport is what POST …/slide answers (the fields the operator uses).
type SlideReport struct {
	Series     string  `json:"series"`
	Slid       []int64 `json:"slid"`
	BytesFreed int64   `json:"bytes_freed"`
}

// ExpireReport is what POST …/expire and DELETE answer.
type ExpireReport struct {
	Series     string  `json:"series"`
	Expired    []int64 `json:"expired"`
	BytesFreed int64   `json:"bytes_freed"`
}

// BackupProgress is GET /v1/series/{ns}/{name}/backup: the backup in progress, if any.
type BackupProgress struct {
	Series       string     `json:"series"`
	Running      bool       `json:"running"`
	LogicalBytes int64      `json:"logicalBytes"`
	StartedAt    *time.Time `json:"startedAt"`
}

// BackupProgress reports how far the series' running backup has got.
func (c *Client) BackupProgress(ctx context.Context, ns, name string) (*BackupProgress, error) {
	var p BackupProgress
	return &p, c.do(ctx, http.MethodGet, seriesPath(ns, name)+"/backup", nil, &p)
}

func seriesPath(ns, name string) string {
	return "/v1/series/" + url.PathEscape(ns) + "/" + url.PathEscape(name)
}

// Ready asks /readyz (no token).
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil)
}

// Stats returns the store totals.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	var s Stats
	return &s, c.do(ctx, http.MethodGet, "/v1/stats", nil, &s)
}

// ListSeries lists the series of one namespace the token can see.
func (c *Client) ListSeries(ctx context.Context, ns string) ([]Series, error) {
	var out []Series
	return out, c.do(ctx, http.MethodGet, "/v1/series?namespace="+url.QueryEscape(ns), nil, &out)
}

// IsUnauthorized reports whether err is the worker's 401 (it does not know the token).
func IsUnauthorized(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusUnauthorized
}

// Series returns one series with its versions (a 404 error when the worker has no such series).
func (c *Client) Series(ctx context.Context, ns, name string) (*Series, error) {
	var s Series
	return &s, c.do(ctx, http.MethodGet, seriesPath(ns, name), nil, &s)
}

// DeleteSeries deletes every version of a series.
func (c *Client) DeleteSeries(ctx context.Context, ns, name string) (*ExpireReport, error) {
	var r ExpireReport
	return &r, c.do(ctx, http.MethodDelete, seriesPath(ns, name), nil, &r)
}

// PutRetention stores a series' retention, creating the series if needed.
func (c *Client) PutRetention(ctx context.Context, ns, name string, r Retention) (*Retention, error) {
	var out Retention
	return &out, c.do(ctx, http.MethodPut, seriesPath(ns, name)+"/retention", r, &out)
}

// Slide reverse-deduplicates the versions that left the live window.
func (c *Client) Slide(ctx context.Context, ns, name string) (*SlideReport, error) {
	var r SlideReport
	return &r, c.do(ctx, http.MethodPost, seriesPath(ns, name)+"/slide", nil, &r)
}

// ExpireByRetention deletes what the series' retention no longer keeps.
func (c *Client) ExpireByRetention(ctx context.Context, ns, name string) (*ExpireReport, error) {
	var r ExpireReport
	body := map[string]bool{"applyRetention": true}
	return &r, c.do(ctx, http.MethodPost, seriesPath(ns, name)+"/expire", body, &r)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("worker %s: %w", c.BaseURL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	// Metadata answers are small; cap what we read so a confused server cannot exhaust memory.
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("worker %s: %s %s: reading the answer: %w", c.BaseURL, method, path, err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		var payload struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &payload) == nil {
			e.Code, e.Message = payload.Code, payload.Message
		}
		if e.Message == "" {
			e.Message = fmt.Sprintf("worker answered %s to %s %s: %s", resp.Status, method, path,
				strings.TrimSpace(string(raw)))
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("worker %s: %s %s: decoding the answer: %w", c.BaseURL, method, path, err)
	}
	return nil
}
