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
/// or it was withdrawn.
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
    /// withdrawn backup 409 ([`Withdrawn`]): either way it never started.
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
                    // Under the claims' lock, so that a newer backup or a
                    // deletion of the series either withdrew this one before
                    // (and it gives the slot back) or finds it running.
                    let _claims = app.backups.lock().unwrap();
                    if let Some(why) = progress.withdrawn.get() {
                        return Err(why.error(series));
                    }
                    progress.queued.store(false, Ordering::SeqCst);
                    return Ok(Slot { _permit: Some(p) });
                }
                _ = tokio::time::sleep(DRAIN_CHECK) => {
                    if let Some(why) = progress.withdrawn.get() {
                        return Err(why.error(series));
                    }
                    if app.draining.load(Ordering::SeqCst) {
                        return Err(ApiError::shutting_down(
                            "the server is shutting down; the backup was waiting for a slot and \
                             no version was created",
                        ));
                    }
                }
            }
        }
    }
}

/// Why a queued backup was withdrawn before it started.
#[derive(Clone, Copy, Debug)]
pub enum Withdrawn {
    /// A newer backup of the series took over (its client may be gone).
    TakenOver,
    /// The series was deleted: a backup that started afterwards would bring
    /// it back, with data its owner meant to be gone.
    SeriesDeleted,
}

impl Withdrawn {
    fn error(self, series: &str) -> ApiError {
        let why = match self {
            Withdrawn::TakenOver => format!(
                "a newer backup of series {series} took over while this one waited for a slot"
            ),
            Withdrawn::SeriesDeleted => {
                format!("series {series} was deleted while this backup waited for a slot")
            }
        };
        ApiError::new(
            StatusCode::CONFLICT,
            ApiCode::Engine(ErrorKind::SeriesBusy),
            format!("{why}; no version was created"),
        )
    }
}

/// Withdraws the queued backup of `series`, if one waits, so that it never
/// starts (`DELETE` of the series). A backup already running is not touched.
pub fn withdraw_queued(app: &App, series: &str, why: Withdrawn) {
    let claims = app.backups.lock().unwrap();
    if let Some(cur) = claims.get(series) {
        if cur.queued.load(Ordering::SeqCst) {
            let _ = cur.withdrawn.set(why);
        }
    }
}

/// Ends a backup's wait however it ends (a slot, a shutdown, a client gone).
struct Unqueue<'a>(&'a App, &'a InflightBackup);

impl Drop for Unqueue<'_> {
    fn drop(&mut self) {
        self.1.queued.store(false, Ordering::SeqCst);
        self.0.metrics.queued_backups.dec();
    }
}
