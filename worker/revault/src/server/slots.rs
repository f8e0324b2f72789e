//! Backup slots: at most `--max-backups` backups run on a worker at once;
//! the others wait their turn, first come first served.
//!
//! Fifty series scheduled for 02:00 all open their backup at 02:00. Run at
//! once, they share the CPU and the disks fifty ways, every one holds its
//! buffers for the whole night and none finishes early; queued, each runs at
//! full speed and the first are done (and durable) while the last wait. A
//! waiting backup reads nothing of its body, so its client just waits on its
//! socket (the body timeouts count only time the server waits for the client,
//! see `limits::PacedBody`), and `GET …/backup` says it is queued.
//!
//! A client that hangs up while queued is noticed only when its turn comes
//! (nothing reads its socket before): so that its retry (a Job's next pod)
//! is not refused as busy meanwhile, a new backup of a series whose backup
//! is still queued takes over from it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use revault_engine::ErrorKind;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, ApiResult};
use super::wire::ApiCode;
use super::{App, InflightBackup};

/// How often a waiting backup looks whether the server began to shut down,
/// or a newer backup of its series took over.
const DRAIN_CHECK: Duration = Duration::from_millis(200);

/// The worker's backup slots; `None` when backups are not limited.
pub struct BackupSlots(Option<Arc<Semaphore>>);

/// A backup's slot, given back when dropped.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
}

impl BackupSlots {
    /// `max` backups at once; 0: no limit.
    pub fn new(max: usize) -> BackupSlots {
        let max = max.min(Semaphore::MAX_PERMITS);
        BackupSlots((max > 0).then(|| Arc::new(Semaphore::new(max))))
    }

    /// Waits for a slot for the backup of `series` whose progress is
    /// `progress`: queued (and counted in the metrics) while it waits. A
    /// server that begins to shut down meanwhile answers 503 instead, and a
    /// newer backup of the series takes over from it with 409 (see
    /// `WriterClaim::take`): either way the backup never started.
    pub async fn wait(
        &self,
        app: &App,
        series: &str,
        progress: &InflightBackup,
    ) -> ApiResult<Slot> {
        let Some(sem) = &self.0 else {
            return Ok(Slot { _permit: None });
        };
        if let Ok(p) = sem.clone().try_acquire_owned() {
            return Ok(Slot { _permit: Some(p) });
        }
        progress.queued.store(true, Ordering::SeqCst);
        app.metrics.queued_backups.inc();
        let _unqueue = Unqueue(app, progress);
        let acquire = sem.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => {
                    // The semaphore is never closed.
                    let p = p.map_err(|e| ApiError::internal(format!("backup slots: {e}")))?;
                    // Under the claims' lock, so that a newer backup of the
                    // series either took over before (and this one gives the
                    // slot back) or finds this one running (and gets 409).
                    let _claims = app.backups.lock().unwrap();
                    if progress.superseded.load(Ordering::SeqCst) {
                        return Err(superseded(series));
                    }
                    progress.queued.store(false, Ordering::SeqCst);
                    return Ok(Slot { _permit: Some(p) });
                }
                _ = tokio::time::sleep(DRAIN_CHECK) => {
                    if progress.superseded.load(Ordering::SeqCst) {
                        return Err(superseded(series));
                    }
                    if app.draining.load(Ordering::SeqCst) {
                        return Err(ApiError::unavailable(
                            "the server is shutting down; the backup was waiting for a slot and \
                             no version was created",
                        ));
                    }
                }
            }
        }
    }
}

fn superseded(series: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        ApiCode::Engine(ErrorKind::SeriesBusy),
        format!(
            "a newer backup of series {series} took over while this one waited for a slot; \
             no version was created"
        ),
    )
}

/// Ends a backup's wait however it ends (a slot, a shutdown, a client gone).
struct Unqueue<'a>(&'a App, &'a InflightBackup);

impl Drop for Unqueue<'_> {
    fn drop(&mut self) {
        self.1.queued.store(false, Ordering::SeqCst);
        self.0.metrics.queued_backups.dec();
    }
}
