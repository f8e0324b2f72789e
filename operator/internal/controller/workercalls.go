package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/revault-io/revault/operator/internal/metrics"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// CallLimits bounds the operator's calls to workers, so that a worker that hangs costs each
// reconcile at most one bounded wait, and then none for a while (see WorkerHealth): the other
// series, on other workers, go on being reconciled.
type CallLimits struct {
	// Quick bounds reads and small writes (status, stats, retention, progress).
	Quick time.Duration
	// Heavy bounds calls whose work grows with the series: slide, expire, delete.
	Heavy time.Duration
	// Pause is how long a worker that did not answer in time is not called again: calls to it
	// fail at once, saying so.
	Pause time.Duration
}

// DefaultCallLimits are the limits of an operator started without flags.
var DefaultCallLimits = CallLimits{Quick: 15 * time.Second, Heavy: 2 * time.Minute, Pause: 30 * time.Second}

// heavyCalls are the calls bounded by CallLimits.Heavy.
var heavyCalls = map[string]bool{"slide": true, "expire": true, "delete_series": true}

// WorkerHealth remembers, per worker URL, until when it is not called again and why.
type WorkerHealth struct {
	mu     sync.Mutex
	silent map[string]silence
}

type silence struct {
	until time.Time
	why   string
}

func NewWorkerHealth() *WorkerHealth {
	return &WorkerHealth{silent: map[string]silence{}}
}

// paused reports whether calls to url fail at once for now, and why.
func (h *WorkerHealth) paused(url string) (silence, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.silent[url]
	if ok && time.Now().After(s.until) {
		delete(h.silent, url)
		return silence{}, false
	}
	return s, ok
}

func (h *WorkerHealth) record(url string, unanswered error, pause time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if unanswered == nil {
		delete(h.silent, url)
		return
	}
	h.silent[url] = silence{until: time.Now().Add(pause), why: unanswered.Error()}
}

// endpoint is one worker URL with the limits and health its calls go by.
type endpoint struct {
	url    string
	limits CallLimits
	health *WorkerHealth
}

func (w *Workers) callsTo(url string) endpoint {
	l := w.Limits
	if l.Quick == 0 {
		l = DefaultCallLimits
	}
	h := w.Health
	if h == nil {
		h = sharedHealth
	}
	return endpoint{url: url, limits: l, health: h}
}

// sharedHealth serves Workers built without one (tests of single helpers).
var sharedHealth = NewWorkerHealth()

// call makes one worker call, bounded by the limits, counted in the operator's metrics. A
// worker that did not answer in time is not called again for a pause: its calls fail at once.
func call[T any](ctx context.Context, at endpoint, op string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if s, ok := at.health.paused(at.url); ok {
		metrics.WorkerRequests.WithLabelValues(op, "skipped").Inc()
		return zero, errors.New(s.why)
	}
	limit := at.limits.Quick
	if heavyCalls[op] {
		limit = at.limits.Heavy
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	v, err := fn(cctx)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	metrics.WorkerRequests.WithLabelValues(op, outcome).Inc()
	switch {
	case err == nil:
		at.health.record(at.url, nil, 0)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && heavyCalls[op]:
		// A slide or expiry of a large series may just take long (the worker goes on with
		// it): a slow heavy call says nothing about the worker's other calls.
		err = fmt.Errorf("the worker at %s did not finish %s within %s", at.url, op, limit)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		// Our bound, not the caller's: the worker hangs.
		err = fmt.Errorf("the worker at %s did not answer %s within %s (not called again for %s)",
			at.url, op, limit, at.limits.Pause)
		at.health.record(at.url, err, at.limits.Pause)
	}
	return v, err
}

// instrumented is the operator's view of a worker: the calls it makes, each counted in the
// operator's metrics, through the generated client.
type instrumented struct {
	c  *workerclient.ClientWithResponses
	at endpoint
}

func (i *instrumented) Stats(ctx context.Context) (*workerclient.Stats, error) {
	return call(ctx, i.at, "stats", func(ctx context.Context) (*workerclient.Stats, error) {
		return workerclient.JSON(i.c.GetStatsWithResponse(ctx))
	})
}

// Series is one series with its versions and what its retention would expire (a 404 error when
// the worker has no such series).
func (i *instrumented) Series(ctx context.Context, ns, name string) (*workerclient.SeriesDetail, error) {
	return call(ctx, i.at, "series", func(ctx context.Context) (*workerclient.SeriesDetail, error) {
		return workerclient.JSON(i.c.GetSeriesWithResponse(ctx, ns, name))
	})
}

// DeleteSeries deletes every version of a series.
func (i *instrumented) DeleteSeries(ctx context.Context, ns, name string) (*workerclient.ExpireReport, error) {
	return call(ctx, i.at, "delete_series", func(ctx context.Context) (*workerclient.ExpireReport, error) {
		return workerclient.JSON(i.c.DeleteSeriesWithResponse(ctx, ns, name))
	})
}

// SetMovedTo seals a series as moved to the address to (its backups are refused with 409
// series_moved), or unseals it with nil. 409 series_busy while a backup of it runs.
func (i *instrumented) SetMovedTo(ctx context.Context, ns, name string, to *string) error {
	_, err := call(ctx, i.at, "set_moved_to", func(ctx context.Context) (*workerclient.Series, error) {
		return workerclient.JSON(i.c.PutMovedToWithResponse(ctx, ns, name, workerclient.PutMovedToJSONRequestBody{MovedTo: to}))
	})
	return err
}

// DeleteVersion expires one version of a series.
func (i *instrumented) DeleteVersion(ctx context.Context, ns, name string, version int64) (*workerclient.ExpireReport, error) {
	return call(ctx, i.at, "delete_version", func(ctx context.Context) (*workerclient.ExpireReport, error) {
		return workerclient.JSON(i.c.DeleteVersionWithResponse(ctx, ns, name, fmt.Sprint(version)))
	})
}

// PutRetention stores a series' retention, creating the series if needed.
func (i *instrumented) PutRetention(ctx context.Context, ns, name string, r workerclient.Retention) error {
	_, err := call(ctx, i.at, "put_retention", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, workerclient.Done(i.c.PutRetentionWithResponse(ctx, ns, name, r))
	})
	return err
}

// Slide reverse-deduplicates the versions that left the live window.
func (i *instrumented) Slide(ctx context.Context, ns, name string) (*workerclient.SlideReport, error) {
	return call(ctx, i.at, "slide", func(ctx context.Context) (*workerclient.SlideReport, error) {
		return workerclient.JSON(i.c.SlideSeriesWithResponse(ctx, ns, name))
	})
}

// ExpireByRetention deletes what the series' retention no longer keeps (its pendingExpiry).
func (i *instrumented) ExpireByRetention(ctx context.Context, ns, name string) (*workerclient.ExpireReport, error) {
	return call(ctx, i.at, "expire", func(ctx context.Context) (*workerclient.ExpireReport, error) {
		var req workerclient.ExpireRequest
		if err := req.FromExpireByRetention(workerclient.ExpireByRetention{ApplyRetention: true}); err != nil {
			return nil, err
		}
		return workerclient.JSON(i.c.ExpireVersionsWithResponse(ctx, ns, name, req))
	})
}

// BackupProgress reports how far the series' running backup has got.
func (i *instrumented) BackupProgress(ctx context.Context, ns, name string) (*workerclient.BackupProgress, error) {
	return call(ctx, i.at, "backup_progress", func(ctx context.Context) (*workerclient.BackupProgress, error) {
		return workerclient.JSON(i.c.GetBackupProgressWithResponse(ctx, ns, name))
	})
}
