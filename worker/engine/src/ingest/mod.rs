//! Inline backup: source → chunking → fingerprints → dedup → containers → commit.
//!
//! Four stages run concurrently, connected by bounded channels (so memory
//! stays bounded whatever the input size):
//!
//! 1. a reading thread reads the source into 1 MiB blocks, noting where each
//!    piece (each file of a tree) ends;
//! 2. a chunking thread cuts each block into chunks (restarting at every
//!    piece), a block's two halves at once on the rayon pool, following
//!    predictions from the series' previous version
//!    ([`crate::ingest::predict::Cutter::cut_span`]);
//! 3. a hashing thread fingerprints each block's chunks in parallel (rayon)
//!    and flags all-zero chunks;
//! 4. the caller's thread groups chunks into segments, looks units up in the
//!    index (in chunk mode, not those the previous version holds: their
//!    copies come with the prediction), and packs new units into containers
//!    (compressed on the pack writer's thread).
//!
//! Nothing is visible until the final commit, which happens only after every
//! container of the session is fsynced.

pub mod chunker;
mod dedup;
mod predict;
pub mod rewrite;
mod scope;
mod stages;

use crate::ingest::dedup::Dedup;
use crate::ingest::stages::Stages;
use crate::store::Session;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::config::DedupUnit;
use crate::config::RewriteSettings;
use crate::error::{Error, Result};
use crate::format::catalog;
use crate::format::keys::{part_key, version_key, CF_CATALOGS, CF_RECIPES, CF_VERSIONS};
use crate::format::records::{RecipeForm, SeriesRecord, VersionKind, VersionRecord};
use crate::ingest::predict::Loader;
use crate::meta::MetaRead;
use crate::source::Source;
use crate::store::domain::DedupScope;
use crate::store::pack::PackWriter;
use crate::store::{check_series_name, now_unix, Store};

const BUF_BYTES: usize = 1 << 20;

use crate::progress::Progress;

/// Extra metadata a backup commits atomically with its version: called with
/// the new version's number and logical size just before the commit, it
/// returns `(column family, key, value)` puts (e.g. the object API's (`revault-objects`)
/// index entry, so an object and its version appear together or not at all).
pub type CommitHook =
    Arc<dyn Fn(u32, u64) -> Result<Vec<(&'static str, Vec<u8>, Vec<u8>)>> + Send + Sync>;

#[derive(Clone, Default)]
pub struct BackupOptions {
    /// Dedup unit for a new series (an existing series keeps its own).
    pub unit: Option<DedupUnit>,
    /// Rewrite policy; stored with the series and used by later backups.
    /// `None` uses the series' stored policy.
    pub rewrite: Option<RewriteSettings>,
    /// Backup time (unix seconds); defaults to now.
    pub time_unix: Option<i64>,
    /// Called with the logical bytes read so far.
    pub progress: Option<Progress>,
    pub cancel: Option<Arc<AtomicBool>>,
    /// Metadata to commit with the version (see [`CommitHook`]).
    pub on_commit: Option<CommitHook>,
    /// The retention of a series this backup creates; `None`: [`Retention::default`]
    /// (automatic slides). An object bucket's series, whose versions are other objects, is
    /// created without.
    pub new_series_retention: Option<crate::format::records::Retention>,
    /// The new version's number; `None`: the series' next. A series copied from another store
    /// (`revault move`) keeps its versions' numbers, gaps and all, so what restore requests,
    /// Velero backups and retention name stays true. Must be at least the series' next number.
    pub version: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BackupReport {
    pub series: String,
    pub version: u32,
    pub kind: VersionKind,
    pub unit: DedupUnit,
    pub time_unix: i64,
    pub logical_bytes: u64,
    pub chunks: u64,
    /// Distinct units the version references.
    pub units: u64,
    pub new_units: u64,
    /// New unique data (uncompressed) and what it took on disk.
    pub new_vbytes: u64,
    pub new_container_bytes: u64,
    pub zero_bytes: u64,
    pub catalog_entries: u64,
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
    pub seconds: f64,
    /// Rewrite policy used, and the duplicates it stored again.
    pub rewrite: String,
    pub rewritten_units: u64,
    pub rewritten_chunks: u64,
    pub rewritten_bytes: u64,
    /// Bytes whose chunk boundaries came from the previous version (checked,
    /// not scanned for; see the predict module).
    pub predicted_bytes: u64,
    /// What the series' automatic retention did after the backup committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slide: Option<crate::maintenance::slide::SlideReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire: Option<crate::maintenance::expire::ExpireReport>,
    /// Why automatic retention failed after the commit (the version exists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_error: Option<String>,
}

pub fn backup(
    store: &Store,
    series_name: &str,
    source: Box<dyn Source>,
    opts: &BackupOptions,
) -> Result<BackupReport> {
    let started = Instant::now();
    store.require_writable()?;
    check_series_name(series_name)?;
    let _claim = store.claim_series(series_name)?;
    let target = open_series(store, series_name, opts)?;
    let mut session = store.begin_session("backup")?;
    let mut pack = PackWriter::for_session(store, &session);
    let cancel = opts.cancel.clone().unwrap_or_default();
    let (stages, loader) = Stages::start(store, &target, source, &cancel);
    let mut d = Dedup::new(store, &target);
    let ended = run_dedup(&mut d, stages, loader, &mut pack, &cancel, opts);
    let pinned = std::mem::take(&mut d.pinned);
    let outcome = ended.and_then(|source| {
        commit_version(&target, &mut d, source, pack, &mut session, opts, started)
    });
    store.unpin(pinned);
    let mut rep = outcome?;
    apply_retention(store, series_name, &mut rep);
    Ok(rep)
}

/// The series a backup writes to, as found under its claim, and the version it will be.
struct Target {
    name: String,
    existing: Option<SeriesRecord>,
    latest: Option<VersionRecord>,
    unit: DedupUnit,
    series_id: u32,
    version: u32,
    rewrite: RewriteSettings,
    /// What this backup may deduplicate against (the store's dedup domain).
    scope: DedupScope,
}

/// The number the new version gets: the series' next, or `asked` when that is not below it.
fn version_number(
    series: &str,
    existing: Option<&SeriesRecord>,
    asked: Option<u32>,
) -> Result<u32> {
    let next = existing.map(|s| s.next_version).unwrap_or(1);
    if next == u32::MAX {
        return Err(Error::Invalid(format!(
            "series {series} has used every version number"
        )));
    }
    match asked {
        None => Ok(next),
        // At most i32::MAX (the API's int32): far from wrapping, whatever comes after.
        Some(v) if v >= next && v <= i32::MAX as u32 => Ok(v),
        Some(v) => Err(Error::Invalid(format!(
            "version {v} of series {series}: the next version must be numbered from {next} to {} \
             (numbers are never reused)",
            i32::MAX
        ))),
    }
}

/// Step 1: the series (new or not), its unit and the rewrite settings this backup uses.
fn open_series(store: &Store, series_name: &str, opts: &BackupOptions) -> Result<Target> {
    let existing = store.meta.series(series_name)?;
    if let Some(to) = existing.as_ref().and_then(|s| s.moved_to.clone()) {
        return Err(Error::SeriesMoved {
            series: series_name.to_string(),
            to,
        });
    }
    // A series without versions takes its unit from this backup: one created by `retention
    // set`, or one emptied by expiring every version (DELETE of the series through the API,
    // after which a new series of the same name may pick another unit).
    let latest = match &existing {
        Some(s) if s.next_version > 1 => store.versions(s)?.pop(),
        _ => None,
    };
    let empty = latest.is_none();
    let unit_kind = match (&existing, opts.unit) {
        (Some(_), Some(u)) if empty => u,
        (Some(s), Some(u)) if s.unit != u => {
            return Err(Error::UnitMismatch {
                series: series_name.to_string(),
                existing: s.unit.to_string(),
                requested: u.to_string(),
            })
        }
        (Some(s), _) => s.unit,
        (None, u) => u.unwrap_or_default(),
    };
    let series_id = existing
        .as_ref()
        .map(|s| s.id)
        .unwrap_or_else(|| store.alloc_series());
    let version = version_number(series_name, existing.as_ref(), opts.version)?;
    let rewrite = match &opts.rewrite {
        Some(r) => {
            r.validate()?;
            r.clone()
        }
        None => existing
            .as_ref()
            .map(|s| s.rewrite.clone())
            .unwrap_or_default(),
    };
    let scope = scope::dedup_scope(
        store.dedup_domain(),
        &store.meta,
        series_name,
        existing.as_ref(),
        latest.as_ref(),
    )?;
    Ok(Target {
        name: series_name.to_string(),
        existing,
        latest,
        unit: unit_kind,
        series_id,
        version,
        rewrite,
        scope,
    })
}

/// Step 2 (with the stages running): deduplicate the hashed chunks as they come, then join
/// every thread. Returns the source (to finish) once all stages ended well; otherwise the
/// root cause: a thread that panicked, or else a source error, rather than the knock-on (a
/// stage that stopped because another one hung up says Cancelled).
fn run_dedup(
    d: &mut Dedup<'_>,
    stages: Stages,
    loader: Option<Loader>,
    pack: &mut PackWriter,
    cancel: &AtomicBool,
    opts: &BackupOptions,
) -> Result<Box<dyn Source>> {
    let store = d.store;
    // The units the loader pins are unpinned with the dedup stage's, even if
    // the loader panicked (the list outlives its thread).
    let loader_pins = parking_lot::Mutex::new(Vec::new());
    let Stages {
        hashed: hashed_rx,
        read: read_thread,
        chunk: chunk_thread,
        hash: hash_thread,
    } = stages;
    let (result, hashed, chunked, read) = std::thread::scope(|scope| {
        let loader_thread = loader.map(|l| {
            let pins = &loader_pins;
            std::thread::Builder::new()
                .name("revault-load".into())
                .spawn_scoped(scope, move || l.run(store, pins))
                .expect("spawn loader")
        });
        let result = (|| -> Result<()> {
            for h in hashed_rx.iter() {
                if cancel.load(Ordering::Relaxed) {
                    return Err(Error::Cancelled);
                }
                d.take_batch(&h, pack)?;
                d.predicted_bytes += h.predicted;
                if let Some(p) = &opts.progress {
                    p(d.logical);
                }
            }
            d.finish(pack)
        })();
        drop(hashed_rx);
        let hashed = hash_thread
            .join()
            .map_err(|p| crate::error::panicked("hashing", p));
        let chunked = chunk_thread
            .join()
            .map_err(|p| crate::error::panicked("chunking", p));
        let read = read_thread
            .join()
            .map_err(|p| crate::error::panicked("reading", p));
        // It stops once the chunking thread is gone, if not before.
        let loaded = loader_thread.map_or(Ok(()), |t| {
            t.join().map_err(|p| crate::error::panicked("loading", p))
        });
        (result.and(loaded), hashed, chunked, read)
    });
    d.pinned.append(&mut loader_pins.into_inner());
    if let Err(e) = result {
        return Err(match (read, hashed, chunked) {
            (Err(p), _, _) | (_, Err(p), _) | (_, _, Err(p)) => p,
            (Ok(Err(src_err)), _, _) if !matches!(src_err, Error::Cancelled) => src_err,
            _ => e,
        });
    }
    hashed?;
    chunked??;
    read?
}

/// Step 3: seal the containers, write the version's recipe, catalog and records, and
/// commit them in one transaction.
fn commit_version(
    target: &Target,
    d: &mut Dedup<'_>,
    source: Box<dyn Source>,
    pack: PackWriter,
    session: &mut Session,
    opts: &BackupOptions,
    started: Instant,
) -> Result<BackupReport> {
    let Target {
        unit: unit_kind,
        series_id,
        version,
        rewrite,
        ..
    } = target;
    let (unit_kind, series_id, version) = (*unit_kind, *series_id, *version);
    let (store, series_name) = (d.store, target.name.as_str());
    let catalog_entries = source.finish()?;
    let containers = pack.finish()?;
    session.sync()?;
    store.failpoint("backup.before_commit")?;
    store.pause_point("backup.before_commit");

    let kind = if catalog_entries.is_some() {
        VersionKind::Tree
    } else {
        VersionKind::Stream
    };
    let recipe_parts = std::mem::take(&mut d.recipe).finish();
    let catalog_parts = catalog_entries
        .as_ref()
        .map(|c| catalog::encode(c))
        .unwrap_or_default();
    let time_unix = opts.time_unix.unwrap_or_else(now_unix);
    let recipe_bytes: u64 = recipe_parts.iter().map(|p| p.len() as u64).sum();
    let catalog_bytes: u64 = catalog_parts.iter().map(|p| p.len() as u64).sum();
    let new_container_bytes: u64 = containers.iter().map(|c| c.1.file_bytes).sum();
    let units = d.referenced.len() as u64;
    let new_units = d.txn.new_units.len() as u64;

    let record = VersionRecord {
        number: version,
        time_unix,
        kind,
        form: RecipeForm::Live,
        logical_bytes: d.logical,
        chunks: d.chunks,
        recipe_parts: recipe_parts.len() as u32,
        recipe_bytes,
        catalog_parts: catalog_parts.len() as u32,
        catalog_bytes,
        catalog_entries: catalog_entries
            .as_ref()
            .map(|c| c.len() as u64)
            .unwrap_or(0),
        new_units,
        new_vbytes: d.new_vbytes,
        new_container_bytes,
        zero_bytes: d.zero_bytes,
        backup_secs: started.elapsed().as_secs_f64(),
    };
    let mut txn = std::mem::take(&mut d.txn);
    txn.session = Some(session.id);
    txn.new_containers = containers;
    for (i, p) in recipe_parts.into_iter().enumerate() {
        txn.puts.push((
            CF_RECIPES,
            part_key(series_id, version, i as u32).to_vec(),
            p,
        ));
    }
    for (i, p) in catalog_parts.into_iter().enumerate() {
        txn.puts.push((
            CF_CATALOGS,
            part_key(series_id, version, i as u32).to_vec(),
            p,
        ));
    }
    txn.put_json(CF_VERSIONS, &version_key(series_id, version), &record);
    let name = series_name.to_string();
    let last = crate::format::records::VersionHint {
        chunks: d.chunks,
        unique_chunks: d.unique_chunks,
        logical_bytes: d.logical,
    };
    let stored_rewrite = rewrite.clone();
    let new_retention = opts.new_series_retention.clone().unwrap_or_default();
    txn.series_updates.push((
        name.clone(),
        Box::new(move |cur| match cur {
            Some(mut s) => {
                s.next_version = version + 1;
                s.generation += 1;
                s.unit = unit_kind;
                s.rewrite = stored_rewrite;
                s.last = last;
                s
            }
            None => SeriesRecord {
                id: series_id,
                name,
                unit: unit_kind,
                created_unix: now_unix(),
                next_version: version + 1,
                retention: new_retention,
                generation: 1,
                deleted_since_gc: false,
                rewrite: stored_rewrite,
                last,
                moved_to: None,
            },
        }),
    ));
    txn.totals.logical_bytes = d.logical as i64;
    txn.totals.versions = 1;
    txn.totals.recipe_bytes = recipe_bytes as i64;
    txn.totals.catalog_bytes = catalog_bytes as i64;
    if let Some(hook) = &opts.on_commit {
        txn.puts.extend(hook(version, d.logical)?);
    }
    store.commit(txn)?;
    session.mark_committed();
    Ok(BackupReport {
        series: series_name.to_string(),
        version,
        kind,
        unit: unit_kind,
        time_unix,
        logical_bytes: d.logical,
        chunks: d.chunks,
        units,
        new_units,
        new_vbytes: d.new_vbytes,
        new_container_bytes,
        zero_bytes: d.zero_bytes,
        catalog_entries: record.catalog_entries,
        recipe_bytes,
        catalog_bytes,
        seconds: started.elapsed().as_secs_f64(),
        rewrite: rewrite.name().to_string(),
        rewritten_units: d.rewritten_units,
        rewritten_chunks: d.rewritten_chunks,
        rewritten_bytes: d.rewritten_bytes,
        predicted_bytes: d.predicted_bytes,
        slide: None,
        expire: None,
        retention_error: None,
    })
}

/// Step 4: the series says so: slide what left the live window, expire what retention no
/// longer keeps. The backup is committed whatever happens here, so a failure is reported
/// beside it, not as the backup's: a client told "no version was created" would retry and
/// store it twice.
fn apply_retention(store: &Store, series_name: &str, rep: &mut BackupReport) {
    match crate::maintenance::auto::apply_auto_claimed(store, series_name) {
        Ok(Some((slid, expired))) => {
            rep.slide = Some(slid);
            rep.expire = Some(expired);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(series = series_name, error = %e, "automatic retention after a backup failed; the scheduler retries");
            rep.retention_error = Some(e.to_string());
        }
    }
}
