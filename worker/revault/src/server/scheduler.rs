//! Background maintenance: slides and retention for series whose stored
//! retention is automatic, and gc now and then.
//!
//! Backups of such series already slide and expire right after they commit
//! (the engine does it while it still holds the series); the periodic pass
//! catches up whatever that missed (a busy series, a failure, a retention
//! changed since). Series with a backup in flight are skipped this round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use super::App;

pub fn spawn(app: Arc<App>, every: Duration, gc_every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if every.is_zero() && gc_every.is_zero() {
            return;
        }
        let tick = if every.is_zero() {
            gc_every
        } else if gc_every.is_zero() {
            every
        } else {
            every.min(gc_every)
        };
        let mut next_maint = Instant::now() + every;
        let mut next_gc = Instant::now() + gc_every;
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            let now = Instant::now();
            let maint = !every.is_zero() && now >= next_maint;
            let gc = !gc_every.is_zero() && now >= next_gc;
            if maint {
                next_maint = now + every;
            }
            if gc {
                next_gc = now + gc_every;
            }
            if !maint && !gc {
                continue;
            }
            if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            // Degraded or reopening: skip this round (see `health`).
            let Ok(store) = app.store() else { continue };
            let a = app.clone();
            let guard = app.begin(None);
            let _ = tokio::task::spawn_blocking(move || {
                let _g = guard;
                if maint {
                    run_retention(&a, &store);
                }
                if gc {
                    let started = Instant::now();
                    match revault_engine::gc(&store, &Default::default()) {
                        Ok(rep) => {
                            a.metrics.maintenance("gc", rep.seconds);
                            tracing::info!(
                                freed_bytes = rep.bytes_freed,
                                containers_freed = rep.containers_freed,
                                secs = rep.seconds,
                                "scheduled gc"
                            );
                            Metrics::result(&a.metrics.maintenance_runs, true);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, secs = started.elapsed().as_secs_f64(), "scheduled gc failed");
                            a.health.kick();
                            Metrics::result(&a.metrics.maintenance_runs, false);
                        }
                    }
                }
            })
            .await;
        }
    })
}

/// One pass over the series with automatic retention.
pub fn run_retention(app: &App, store: &revault_engine::Store) {
    let series = match store.list_series() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "scheduler: cannot list series");
            return;
        }
    };
    for s in series.into_iter().filter(|s| s.retention.auto) {
        if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if app.backups.lock().unwrap().contains_key(&s.name) {
            continue; // its backup will slide and expire when it commits
        }
        // The listing may be stale: `apply_auto` reads the retention again
        // under the series claim and does nothing if it is no longer auto.
        match revault_engine::apply_auto(store, &s.name) {
            Ok(None) => {}
            Ok(Some((sl, ex))) => {
                app.metrics.maintenance("slide", sl.seconds);
                app.metrics.maintenance("expire", ex.seconds);
                if !sl.slid.is_empty() || !ex.expired.is_empty() {
                    tracing::info!(series = %s.name, slid = ?sl.slid, expired = ?ex.expired, secs = sl.seconds + ex.seconds, "scheduled retention");
                    app.refresh_series(store, &s.name);
                }
                Metrics::result(&app.metrics.maintenance_runs, true);
            }
            Err(revault_engine::Error::SeriesBusy { .. }) => {}
            Err(e) => {
                tracing::warn!(series = %s.name, error = %e, "scheduled retention failed");
                app.health.kick();
                Metrics::result(&app.metrics.maintenance_runs, false);
            }
        }
    }
}
